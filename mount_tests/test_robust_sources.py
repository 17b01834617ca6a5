"""Sources as users type them, and save dirs with a broken part.

- Every spelling of one source dir (trailing slashes, `./`, `..`, a symlink to it) gives the same
  checkpoint (inspect --json) and the same mount (file names and bytes), for every bundled example format.
- A broken tag other than the root one (an older step, a damaged <tag>_universal/ beside a good tag) is
  left out: the rest mounts, the error (naming the broken file) is in `inspect`, ckptfs.json and the
  mount's log, also when the mount loads the index cache; `-o strict` / `--strict` refuse instead, with
  the broken file's exit code. A broken root tag is refused either way.
"""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import helpers as H
from mounting import foreground, mounted, run_ckptfs

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
DIR_EXAMPLES = ["deepspeed-zero3-bf16", "deepspeed-universal-z2-bf16", "deepspeed-moe-ep2", "dcp-shard1-ws2",
                "dcp-hf-storage-ws2", "megatron-tp2-pp2", "verl-fsdp2-ws2"]


def inspect_json(ckptfs_bin, src, *flags):
    proc = H.run([ckptfs_bin, "inspect", str(src), "--json", *flags])
    H.assert_ok(proc)
    return json.loads(proc.stdout)


def tree_digest(mnt):
    """{relative path: sha256} of every file below the mount (ckptfs.json aside: it names the source)."""
    out = {}
    for root, _, files in os.walk(mnt):
        for name in files:
            path = Path(root) / name
            rel = str(path.relative_to(mnt))
            if rel != "ckptfs.json":
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def spellings(tmp_path, src):
    """The same dir spelt five ways: as is, with trailing slashes, through ./ and .., through a symlink."""
    link = tmp_path / "link-to-source"
    link.symlink_to(src, target_is_directory=src.is_dir())
    out = [str(src), f"{src}/", f"{src}//", f"{src.parent}/./{src.name}/", f"{src}/../{src.name}", f"{link}/"]
    return out if src.is_dir() else [str(src), f"{src.parent}/./{src.name}", str(link)]


@pytest.mark.parametrize("example", DIR_EXAMPLES + ["torch-save-file/full_state.pt"])
def test_every_spelling_of_a_source_gives_the_same_checkpoint(ckptfs_bin, tmp_path, example):
    src = EXAMPLES / example
    reference = inspect_json(ckptfs_bin, src)
    assert reference["tags"] and reference["latest"] in [t["name"] for t in reference["tags"]]
    for spelt in spellings(tmp_path, src):
        assert inspect_json(ckptfs_bin, spelt) == reference, f"inspect of {spelt!r} differs from {src}"


@pytest.mark.parametrize("example", DIR_EXAMPLES)
def test_a_mount_through_a_trailing_slash_or_symlink_is_the_same_mount(ckptfs_bin, tmp_path, example):
    src = EXAMPLES / example
    with mounted(ckptfs_bin, src, tmp_path / "plain", "-o", "index_cache=off") as mnt:
        reference = tree_digest(mnt)
    assert "model.safetensors" in reference and any(p.startswith("tags/") for p in reference)
    for i, spelt in enumerate(spellings(tmp_path, src)[1:]):
        with mounted(ckptfs_bin, spelt, tmp_path / f"m{i}", "-o", "index_cache=off") as mnt:
            assert tree_digest(mnt) == reference, f"the mount of {spelt!r} differs from that of {src}"


# --- broken parts ---------------------------------------------------------------------------------------

def with_broken_part(tmp_path, example, base, part, copied_from, broken_file, keep=100):
    """A copy of examples/<example> at <tmp>/src/<base> plus, unless `copied_from` is None (the example
    has the part already), a copy of `copied_from` (a path below the copy, or an example's name) as
    <tmp>/src/<part>, whose `broken_file` is then truncated to `keep` bytes (None: half its size);
    returns (src, the broken tag's name, the broken file)."""
    src = tmp_path / "src"
    shutil.copytree(EXAMPLES / example, src / base)
    if copied_from is not None:
        shutil.copytree(src / copied_from if (src / copied_from).exists() else EXAMPLES / copied_from, src / part)
    broken = src / part / broken_file
    with open(broken, "r+b") as f:
        f.truncate(broken.stat().st_size // 2 if keep is None else keep)
    return src, part, broken


def deepspeed_with_broken_older_tag(tmp_path):
    """The bundled ZeRO-3 save dir (latest: global_step3) plus a copy of its tag as global_step1 whose
    rank-1 optimizer file is truncated."""
    return with_broken_part(tmp_path, "deepspeed-zero3-bf16", ".", "global_step1", "global_step3",
                            "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")


def deepspeed_with_broken_universal_dir(tmp_path):
    """The bundled ZeRO-3 save dir with a damaged universal checkpoint beside its tag."""
    return with_broken_part(tmp_path, "deepspeed-zero3-bf16", ".", "global_step3_universal",
                            "deepspeed-universal-z2-bf16", "zero/embed.weight/fp32.pt")


def megatron_with_broken_older_iteration(tmp_path):
    return with_broken_part(tmp_path, "megatron-tp2-pp2", ".", "iter_0000001", "iter_0000003",
                            "mp_rank_01_001/model_optim_rng.pt")


def dcp_with_broken_older_step(tmp_path):
    """A folder of DCP step dirs (the highest step served at the root) whose step-1 lost its metadata."""
    return with_broken_part(tmp_path, "dcp-shard1-ws2", "step-2", "step-1", "step-2", ".metadata", keep=10)


def verl_with_broken_older_step(tmp_path):
    """The bundled verl save dir (tracker: step 2) whose step 1 lost half of rank 1's model file."""
    return with_broken_part(tmp_path, "verl-fsdp2-ws2", ".", "global_step_1", None,
                            "actor/model_world_size_2_rank_1.pt", keep=None)


BROKEN = {
    "deepspeed older tag": deepspeed_with_broken_older_tag,
    "deepspeed universal dir": deepspeed_with_broken_universal_dir,
    "megatron older iteration": megatron_with_broken_older_iteration,
    "dcp older step": dcp_with_broken_older_step,
    "verl older step": verl_with_broken_older_step,
}


@pytest.fixture(params=list(BROKEN), ids=list(BROKEN))
def broken_source(request, tmp_path):
    return BROKEN[request.param](tmp_path)


def test_a_broken_other_tag_is_left_out_and_reported(ckptfs_bin, tmp_path, broken_source):
    src, bad_tag, broken = broken_source
    described = inspect_json(ckptfs_bin, src)
    names = [t["name"] for t in described["tags"]]
    assert bad_tag not in names and described["latest"] in names
    [left_out] = described["left_out"]
    assert left_out["tag"] == bad_tag and broken.name in left_out["error"], left_out
    text = H.run([ckptfs_bin, "inspect", str(src)])
    H.assert_ok(text)
    assert f"left out:   tag {bad_tag}: " in text.stdout and broken.name in text.stdout
    # the mount: the rest is served (tags/ without the broken one), the log line, ckptfs.json; twice, the
    # second time from the index cache the first mount wrote
    cache = tmp_path / "index-cache"
    for attempt in ("parsed", "from the index"):
        with foreground(ckptfs_bin, src, tmp_path / "mnt", "-o", f"index_cache={cache}") as proc:
            mnt = tmp_path / "mnt"
            tags = sorted(os.listdir(mnt / "tags"))
            assert bad_tag not in tags and described["latest"] in tags, (attempt, tags)
            assert (mnt / "model.safetensors").stat().st_size > 0
            with open(mnt / "model.safetensors", "rb") as f:
                assert len(f.read()) == (mnt / "model.safetensors").stat().st_size
            mounted_json = json.loads((mnt / "ckptfs.json").read_text())
            assert mounted_json["left_out"] == described["left_out"], attempt
        log = proc.stderr.read()
        assert f"left out tag {bad_tag}" in log and broken.name in log, (attempt, log)
        assert any(cache.iterdir()), "the first mount wrote no index"


def test_strict_refuses_a_source_with_a_broken_tag(ckptfs_bin, tmp_path, broken_source):
    src, _, broken = broken_source
    for args in (["inspect", str(src), "--strict"], ["index", str(src), "--strict", "--cache", str(tmp_path / "c")],
                 ["export", str(src), str(tmp_path / "out"), "--strict"]):
        proc = H.run([ckptfs_bin, *args])
        H.assert_one_line_error(proc, proc.returncode if proc.returncode in (3, 4) else 4, [broken.name])
    os.makedirs(tmp_path / "mnt")
    proc = run_ckptfs(ckptfs_bin, src, tmp_path / "mnt", "-o", "strict,index_cache=off")
    assert proc.returncode in (3, 4) and broken.name in proc.stderr, H.describe(proc)
    assert not os.path.ismount(tmp_path / "mnt")


def test_a_broken_root_tag_is_refused_without_strict(ckptfs_bin, tmp_path):
    src, _, _ = deepspeed_with_broken_older_tag(tmp_path)
    (src / "latest").write_text("global_step1")
    proc = H.run([ckptfs_bin, "inspect", str(src)])
    H.assert_one_line_error(proc, 4, ["bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"])
    # and --tag makes the named tag the root
    proc = H.run([ckptfs_bin, "inspect", str(src), "--tag", "global_step1"])
    H.assert_one_line_error(proc, 4, ["bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"])
    (src / "latest").write_text("global_step3")
    described = inspect_json(ckptfs_bin, src, "--tag", "global_step3")
    assert [t["name"] for t in described["tags"]] == ["global_step3"] and described["left_out"] == []
