"""The index cache (`-o index_cache=DIR`, `ckptfs index SRC`): a mount of unchanged sources loads the
index instead of parsing, and serves exactly what a parse serves; any change to a source file, a tag dir
or a control file, a damaged index, or another ckptfs build's index (another GNU build id) falls back to
parsing (and rewrites the index), never to wrong bytes.  What "exactly what a parse serves" means here: a mount that loaded the
index and a mount with `-o index_cache=off` (which parses) hold the same tree, every directory and every
file with the same bytes (every view, tags/, universal/, side files, ckptfs.json), for every framework
ckptfs reads.  Each mount here names its index cache: a folder of the test's own, or off."""
import json
import os
import re
import shutil
import subprocess

import pytest

import helpers as H
from conftest import REAL_DIR, case_info
from mount_walk import tree_of
from mounting import foreground, mounted, run_ckptfs, wait_until

REPO = H.REPO
LOADED = "index loaded from"
PARSED = "parsed the sources"
# (label, path relative to the repo or a generated DeepSpeed case name, top-level entries its mount must have)
SOURCES = [
    ("deepspeed-zero3", "examples/deepspeed-zero3-bf16", ["universal", "fp32", "tags", "config.json"]),
    ("deepspeed-universal", "examples/deepspeed-universal-z2-bf16", ["fp32", "model.safetensors", "tags"]),
    ("dcp", "examples/dcp-shard1-ws2", ["full_state.pt", "fp32", "model.safetensors", "tags"]),
    ("torch-save", "examples/torch-save-file/full_state.pt", ["fp32", "model.safetensors", "tags"]),
    ("megatron-legacy", "mount_tests/fixtures/megatron-real/legacy_tp2_pp2/checkpoint", ["hf", "fp32", "tags"]),
    ("megatron-torch-dist", "mount_tests/fixtures/megatron-real/torch_dist_tp2_pp2/checkpoint", ["hf", "fp32", "tags"]),
    ("deepspeed-real", None, ["universal", "fp32", "tags"]),
    ("pipeline", "case:pp2_z1_fp16_dp2", ["universal", "fp32", "tags"]),
    ("two-tags", "case:twotags_z2_bf16_dp2", ["universal", "fp32", "tags"]),
]


def source_path(fixtures_dir, spec):
    if spec is None:
        return os.path.join(REAL_DIR, sorted(d for d in os.listdir(REAL_DIR) if os.path.isdir(os.path.join(REAL_DIR, d)))[0], "checkpoint")
    if spec.startswith("case:"):
        return os.path.join(fixtures_dir, spec[5:], case_info(fixtures_dir, spec[5:])["src"])
    return os.path.join(REPO, spec)


def stderr_of(proc):
    """What `ckptfs -f` said before serving (the index line comes before the mount is live)."""
    return proc.stderr.readline()


def assert_serves_what_parsing_serves(ckptfs_bin, src, mnt, tmp_path):
    """The mount `mnt` (from an index) holds the tree a parsing mount of `src` (index_cache=off) holds."""
    with mounted(ckptfs_bin, src, tmp_path / "parsed", index_cache="off") as parsed:
        want = tree_of(parsed)
    got = tree_of(mnt)
    assert sorted(got) == sorted(want), f"only from the index: {sorted(set(got) - set(want))[:10]}, " \
                                        f"only parsed: {sorted(set(want) - set(got))[:10]}"
    differ = [p for p, data in want.items() if got[p] != data]
    assert not differ, f"{len(differ)} of {len(want)} entries differ: {differ[:10]}"
    assert want["ckptfs.json"], "no ckptfs.json"
    return want


@pytest.mark.parametrize("label,spec,entries", SOURCES, ids=[s[0] for s in SOURCES])
def test_mount_from_the_index_serves_what_parsing_serves(label, spec, entries, fixtures_dir, ckptfs_bin, tmp_path):
    src = source_path(fixtures_dir, spec)
    cache = tmp_path / "cache"
    r = run_ckptfs(ckptfs_bin, "index", src, "--cache", cache)
    H.assert_ok(r)
    index_file = r.stdout.strip()
    assert os.path.dirname(index_file) == str(cache) and os.path.getsize(index_file) > 0
    with foreground(ckptfs_bin, src, tmp_path / "mnt", index_cache=cache) as p:
        assert stderr_of(p).startswith(f"ckptfs: {LOADED} {index_file}")
        tree = assert_serves_what_parsing_serves(ckptfs_bin, src, tmp_path / "mnt", tmp_path)
    missing = [e for e in entries if e not in tree]
    assert not missing, f"{label}: the mount lacks {missing}: the comparison would not cover them"


def mount_says(ckptfs_bin, src, mnt, cache):
    with foreground(ckptfs_bin, src, mnt, index_cache=cache) as p:
        line = stderr_of(p)
        listing = sorted(os.listdir(mnt))
    return line, listing


def test_first_mount_writes_the_index_and_the_second_loads_it(case_copy, ckptfs_bin, tmp_path):
    src = case_copy("z2_bf16_dp2")
    cache = tmp_path / "cache"
    first, _ = mount_says(ckptfs_bin, src, tmp_path / "m1", cache)
    assert PARSED in first and "no index yet" in first, first
    second, _ = mount_says(ckptfs_bin, src, tmp_path / "m2", cache)
    assert LOADED in second, second


@pytest.mark.parametrize("change", ["touch rank file", "replace rank file", "new tag dir", "rewrite latest",
                                    "new side file"])
def test_a_changed_source_is_parsed_again(change, case_copy, ckptfs_bin, tmp_path):
    src = case_copy("twotags_z2_bf16_dp2")
    cache = tmp_path / "cache"
    H.assert_ok(run_ckptfs(ckptfs_bin, "index", src, "--cache", cache))
    tags = sorted(d for d in os.listdir(src) if d.startswith("global_step"))
    rank = os.path.join(src, tags[-1], "mp_rank_00_model_states.pt")
    if change == "touch rank file":
        st = os.stat(rank)
        os.utime(rank, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif change == "replace rank file":  # same bytes, new inode
        shutil.copy2(rank, rank + ".new")
        os.replace(rank + ".new", rank)
    elif change == "new tag dir":
        shutil.copytree(os.path.join(src, tags[-1]), os.path.join(src, "global_step99"))
    elif change == "rewrite latest":  # in place: the save dir's mtime does not change
        with open(os.path.join(src, "latest"), "r+") as f:
            f.write(tags[0])
            f.truncate()
    else:  # an HF Trainer writing config.json into the step dir after the checkpoint
        with open(os.path.join(src, tags[-1], "config.json"), "w") as f:
            f.write("{}")
    line, listing = mount_says(ckptfs_bin, src, tmp_path / "mnt", cache)
    assert PARSED in line and "changed since it was indexed" in line, line
    with foreground(ckptfs_bin, src, tmp_path / "mnt2", index_cache=cache) as p:
        assert LOADED in stderr_of(p)  # the parse rewrote the index
        assert_serves_what_parsing_serves(ckptfs_bin, src, tmp_path / "mnt2", tmp_path)
        if change == "new tag dir":  # `latest` does not name it: a save in progress to a (live) mount
            assert "global_step99" not in os.listdir(tmp_path / "mnt2" / "tags")
            with open(tmp_path / "mnt2" / "ckptfs.json") as f:
                assert json.load(f)["in_progress"] == ["global_step99"]


def indexed_copy(case_copy, ckptfs_bin, tmp_path):
    """A copy of a case indexed by `ckptfs index`: (source, cache dir, index file, its bytes)."""
    src = case_copy("z1_bf16_dp2")
    cache = tmp_path / "cache"
    r = run_ckptfs(ckptfs_bin, "index", src, "--cache", cache)
    H.assert_ok(r)
    index_file = r.stdout.strip()
    return src, cache, index_file, bytearray(open(index_file, "rb").read())


DAMAGES = ["truncated", "garbage", "other version"] + [f"flipped byte at {k}/8" for k in range(1, 8)]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_index_is_parsed_again(damage, case_copy, ckptfs_bin, tmp_path):
    src, cache, index_file, data = indexed_copy(case_copy, ckptfs_bin, tmp_path)
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage.startswith("flipped byte"):  # anywhere: a header field, the lz4 frame's blocks or checksums
        k = int(damage.split()[-1].split("/")[0])
        data[len(data) * k // 8] ^= 0xFF
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:  # the key names the ckptfs version
        at = data.index(b"ckptfs ")
        data[at + 7] = ord("9")
    open(index_file, "wb").write(bytes(data))
    with foreground(ckptfs_bin, src, tmp_path / "mnt", index_cache=cache) as p:
        line = stderr_of(p)
        assert PARSED in line, line
        assert_serves_what_parsing_serves(ckptfs_bin, src, tmp_path / "mnt", tmp_path)


def test_index_cache_off_reads_and_writes_nothing(case_copy, ckptfs_bin, tmp_path, monkeypatch):
    src = case_copy("z1_bf16_dp2")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with foreground(ckptfs_bin, src, tmp_path / "mnt", index_cache="off") as p:
        assert sorted(os.listdir(tmp_path / "mnt"))
    assert LOADED not in p.stderr.read() and not (tmp_path / "xdg").exists()


def test_default_cache_dir_is_under_xdg_cache_home(case_copy, ckptfs_bin, tmp_path, monkeypatch):
    src = case_copy("z1_bf16_dp2")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    r = run_ckptfs(ckptfs_bin, "index", src)
    H.assert_ok(r)
    assert r.stdout.strip().startswith(str(tmp_path / "xdg" / "ckptfs") + "/")
    with foreground(ckptfs_bin, src, tmp_path / "mnt", index_cache=None) as p:  # the default: XDG_CACHE_HOME
        assert LOADED in stderr_of(p)


def build_id_of(binary):
    """The GNU build id of `binary` as binutils reads it (independent of ckptfs's own reader)."""
    notes = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", notes).group(1)


def test_an_index_of_another_build_is_not_trusted(case_copy, ckptfs_bin, tmp_path):
    src, cache, index_file, data = indexed_copy(case_copy, ckptfs_bin, tmp_path)
    build_id = build_id_of(ckptfs_bin).encode()
    at = data.find(build_id)
    assert at > 0, "the index header does not hold the binary's build id"
    data[at] = ord("0") if data[at] != ord("0") else ord("1")  # as if an older build had written it
    open(index_file, "wb").write(bytes(data))
    line, listing = mount_says(ckptfs_bin, src, tmp_path / "m1", cache)
    assert PARSED in line and "another ckptfs build" in line, line
    assert "model.safetensors" in listing
    again, _ = mount_says(ckptfs_bin, src, tmp_path / "m2", cache)  # the parse rewrote it for this build
    assert LOADED in again, again


def test_an_unwritable_cache_dir_does_not_stop_the_mount(case_copy, ckptfs_bin, tmp_path):
    src = case_copy("z1_bf16_dp2")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with foreground(ckptfs_bin, src, tmp_path / "mnt", index_cache=f"{blocker}/cache") as p:
        assert PARSED in stderr_of(p)
        assert "model.safetensors" in os.listdir(tmp_path / "mnt")
    warning = p.stderr.read()  # the index is written once the mount is live: a warning, not a failure
    assert "index not written" in warning and str(blocker) in warning, warning
    assert p.returncode == 0
    with mounted(ckptfs_bin, src, tmp_path / "mnt2", "-o", f"index_cache={blocker}/cache") as mnt:  # exit 0
        assert "model.safetensors" in os.listdir(mnt)


def test_index_into_an_unwritable_cache_dir_is_an_output_failure(case_copy, ckptfs_bin, tmp_path):
    src = case_copy("z1_bf16_dp2")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    r = run_ckptfs(ckptfs_bin, "index", src, "--cache", blocker / "cache")
    H.assert_one_line_error(r, H.EXIT_OUTPUT, [str(blocker)])


def test_tags_option_gets_its_own_index(case_copy, ckptfs_bin, tmp_path):
    src = case_copy("twotags_z2_bf16_dp2")
    cache = tmp_path / "cache"
    tags = sorted(d for d in os.listdir(src) if d.startswith("global_step"))
    a = run_ckptfs(ckptfs_bin, "index", src, "--cache", cache)
    b = run_ckptfs(ckptfs_bin, "index", src, "--cache", cache, "--tag", tags[0])
    H.assert_ok(a)
    H.assert_ok(b)
    assert a.stdout != b.stdout
    with foreground(ckptfs_bin, src, tmp_path / "mnt", "--tag", tags[0], index_cache=cache) as p:
        assert LOADED in stderr_of(p)
        assert sorted(os.listdir(tmp_path / "mnt" / "tags")) == [tags[0]]


def test_index_of_a_broken_source_fails_like_a_mount(case_copy, ckptfs_bin, tmp_path):
    src = case_copy("z1_bf16_dp2")
    tag = next(d for d in os.listdir(src) if d.startswith("global_step"))
    victim = sorted(f for f in os.listdir(src / tag) if "optim_states" in f)[0]
    with open(src / tag / victim, "r+b") as f:
        f.truncate(100)
    r = run_ckptfs(ckptfs_bin, "index", src, "--cache", tmp_path / "cache")
    H.assert_one_line_error(r, H.EXIT_INVALID, [victim])
    assert not (tmp_path / "cache").exists() or not os.listdir(tmp_path / "cache")


def test_a_live_mount_rewrites_the_index_as_the_run_saves(case_copy, ckptfs_bin, tmp_path):
    """A tag saved under a live mount (its files, then `latest`) is in the index the mount rewrites: the next
    mount loads it, and serves what a parse serves, the new tag at the root."""
    src = case_copy("twotags_z2_bf16_dp2")
    cache = tmp_path / "cache"
    with foreground(ckptfs_bin, src, tmp_path / "mnt", index_cache=cache) as p:
        assert PARSED in stderr_of(p)
        shutil.copytree(os.path.join(src, "global_step4"), os.path.join(src, "global_step6"))
        with open(os.path.join(src, "latest"), "w") as f:
            f.write("global_step6")

        def root_tag():
            with open(tmp_path / "mnt" / "ckptfs.json") as f:
                return json.load(f)["root_tag"]
        assert wait_until(lambda: root_tag() == "global_step6", timeout=30), root_tag()
    # the server has exited: the index written after the refresh is complete
    with foreground(ckptfs_bin, src, tmp_path / "mnt2", index_cache=cache) as p:
        assert LOADED in stderr_of(p)
        assert sorted(os.listdir(tmp_path / "mnt2" / "tags")) == ["global_step2", "global_step4", "global_step6"]
        assert_serves_what_parsing_serves(ckptfs_bin, src, tmp_path / "mnt2", tmp_path)
