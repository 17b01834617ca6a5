"""`ckptfs cat SRC VIEW_PATH [--tag T] [-o FILE]`: one file of the mount's tree streamed without FUSE.

For generated DeepSpeed cases and real fixtures (verl, Megatron-LM, DeepSpeed's universal tree), every kind of
view (safetensors, pytorch_model.bin, a universal/ file, hf/, side files, ckptfs.json, tags/<tag>/, --tag)
is read three ways: `ckptfs cat` to a pipe, `ckptfs cat -o FILE`, and through a FUSE mount of the same
source; the three must be the same bytes, and those bytes must match the independent reference the other
test files use (the generator's tensors, the frameworks' golden files). Also: an s3:// source; `| head -c`
ends ckptfs quietly (SIGPIPE); an unknown or directory VIEW_PATH exits 2 and lists what is there; a source
truncated or rewritten while it is read exits 3 naming it; the peak memory of a 160 MiB view stays a small
fraction of it.
"""
import hashlib
import io
import json
import os
import signal
import stat
import subprocess
import sys

import pytest
import torch

import helpers as H
from conftest import case_info, case_source, generate_only
from mount_walk import info_without_live
from mounting import mounted
from s3_gateway import s3_gateway  # noqa: F401 (the session fixture)
from test_real_megatron import HF_REF, check_hf_config
from test_real_verl import expected_safetensors
from test_universal import Expect, assert_same, check_param_file, load_pt

GENERATED = "twotags_z2_bf16_dp2"  # ZeRO-2 bf16, two tags, a universal/ tree
DS_REAL = os.path.join(H.HERE, "fixtures", "deepspeed-real", "z0_bf16_ws2")
VERL_REAL = os.path.join(H.HERE, "fixtures", "verl-real", "fsdp1_fp32_ws2")
MEGATRON_REAL = os.path.join(H.HERE, "fixtures", "megatron-real", "legacy_tp2_pp2")
EXAMPLE = os.path.join(H.REPO, "examples", "deepspeed-zero3-bf16")  # with config.json, tokenizer.json
CHUNK = 8 << 20  # the chunk cat reads (src/cli/view_output.cpp)
BIG_ELEMENTS = 40 << 20  # a 160 MiB fp32 view: 20 chunks


def read(path):
    with open(path, "rb") as f:
        return f.read()


def cat(ckptfs_bin, src, view, *options, **kw):
    """`ckptfs cat` with stdout a pipe: the CompletedProcess, stdout as bytes."""
    return subprocess.run([ckptfs_bin, "cat", str(src), view, *map(str, options)], capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=H.DEFAULT_TIMEOUT, **kw)


def cat_both_ways(ckptfs_bin, src, view, out, *options, **kw):
    """The bytes `ckptfs cat` writes to a pipe, checked equal to what `cat -o out` writes (nothing else left
    beside `out`, nothing on stderr)."""
    piped = cat(ckptfs_bin, src, view, *options, **kw)
    assert piped.returncode == 0 and piped.stderr == b"", f"cat {src} {view}: {piped.returncode} {piped.stderr!r}"
    to_file = cat(ckptfs_bin, src, view, "-o", out, *options, **kw)
    assert to_file.returncode == 0 and to_file.stdout == b"" and to_file.stderr == b"", to_file
    assert read(out) == piped.stdout, f"{view}: cat -o FILE and cat to a pipe differ"
    assert not os.path.exists(f"{out}.partial")
    return piped.stdout


def check_against_mount(ckptfs_bin, src, views, tmp_path, *options):
    """{view: bytes}: each view by cat (both ways), equal to the same path of a FUSE mount of `src` (ckptfs.json
    but for the live mount's "live" section, which cat's, a snapshot, has not)."""
    got = {}
    with mounted(ckptfs_bin, src, tmp_path / "mnt", *options) as mnt:
        for i, view in enumerate(views):
            got[view] = cat_both_ways(ckptfs_bin, src, view, tmp_path / f"out{i}", *options)
            mounted_bytes = read(os.path.join(mnt, view))
            if view.endswith("ckptfs.json"):
                assert "live" not in json.loads(got[view])
                assert info_without_live(got[view]) == info_without_live(mounted_bytes)
            else:
                assert got[view] == mounted_bytes, f"{view}: cat gave {len(got[view])} bytes, the mount {len(mounted_bytes)}"
    return got


def torch_load(raw):
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


# ----------------------------------------------------------------------------------------------------
# every kind of view, against the mount and the references

@pytest.fixture(scope="module")
def generated():
    fixtures = generate_only([GENERATED])
    return fixtures, case_source(fixtures, GENERATED), case_info(fixtures, GENERATED)


def expected_of(fixtures, info, tag):
    d = os.path.join(fixtures, GENERATED, info["expected"][tag])
    return H.load_expected(os.path.join(d, "fp32.pt")), H.load_expected(os.path.join(d, "model.pt"))


def test_generated_deepspeed_views(ckptfs_bin, generated, tmp_path):
    fixtures, src, info = generated
    latest = info["latest"]
    old = next(t for t in info["tags"] if t != latest)
    exp = Expect(fixtures, GENERATED, latest)
    param = sorted(exp.params)[0]
    universal = f"universal/{latest}_universal/zero/{param}/fp32.pt"
    views = ["model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors", universal,
             f"tags/{old}/model.safetensors", f"tags/{old}/fp32/pytorch_model.bin", "ckptfs.json"]
    got = check_against_mount(ckptfs_bin, src, views, tmp_path)
    for tag, prefix in ((latest, ""), (old, f"tags/{old}/")):
        fp32, model = expected_of(fixtures, info, tag)
        H.assert_state_equal(H.parse_safetensors(got[f"{prefix}model.safetensors"], "model.safetensors"), model,
                             ordered=False, what=f"cat {prefix}model.safetensors")
        H.assert_state_equal(torch_load(got[f"{prefix}fp32/pytorch_model.bin"]), fp32, ordered=True,
                             what=f"cat {prefix}fp32/pytorch_model.bin")
    H.assert_state_equal(H.parse_safetensors(got["fp32/model.safetensors"], "fp32"), expected_of(fixtures, info, latest)[0],
                         ordered=False, what="cat fp32/model.safetensors")
    (tmp_path / "fp32.pt").write_bytes(got[universal])
    check_param_file(tmp_path / "fp32.pt", exp.param_object(param, "fp32"), "fp32")
    assert json.loads(got["ckptfs.json"])["root_tag"] == latest

    # --tag T: the tree of `ckptfs --tag T SRC MNT`, the old tag's bytes at the root
    with_tag = cat_both_ways(ckptfs_bin, src, "model.safetensors", tmp_path / "tagged", "--tag", old)
    assert with_tag == got[f"tags/{old}/model.safetensors"] != got["model.safetensors"]


def test_real_verl_views(ckptfs_bin, tmp_path):
    src = os.path.join(VERL_REAL, "checkpoint")
    hf = os.path.join(src, "global_step_2", "actor", "huggingface")
    got = check_against_mount(ckptfs_bin, src, ["model.safetensors", "fp32/model.safetensors",
                                                "fp32/pytorch_model.bin", "config.json", "generation_config.json",
                                                "tokenizer.json"], tmp_path)
    golden = os.path.join(VERL_REAL, "golden")
    # byte for byte the files verl's model merger wrote
    assert got["model.safetensors"] == expected_safetensors(golden + ".manifest.json", golden + ".bin")[0]
    native, _ = expected_safetensors(golden + ".native.manifest.json", golden + ".native.bin")
    assert got["fp32/model.safetensors"] == native
    H.assert_state_equal(torch_load(got["fp32/pytorch_model.bin"]), H.parse_safetensors(native, "native"), ordered=False,
                         what="cat fp32/pytorch_model.bin vs the live fp32 state dict")
    assert got["config.json"] == read(golden + ".config.json")
    for side in ("generation_config.json", "tokenizer.json"):
        assert got[side] == read(os.path.join(hf, side)), f"{side} differs from huggingface/'s"


def test_real_megatron_hf_views(ckptfs_bin, tmp_path):
    src = os.path.join(MEGATRON_REAL, "checkpoint")
    got = check_against_mount(ckptfs_bin, src, ["hf/model.safetensors", "hf/config.json",
                                                "tags/iter_0000003/fp32/pytorch_model.bin"], tmp_path)
    assert got["hf/model.safetensors"] == read(os.path.join(HF_REF, "model.safetensors"))
    check_hf_config(json.loads(got["hf/config.json"]), json.loads(read(os.path.join(HF_REF, "config.json"))),
                    "cat hf/config.json")


def test_real_deepspeed_universal_files(ckptfs_bin, tmp_path):
    src = os.path.join(DS_REAL, "checkpoint")
    theirs = os.path.join(src, "global_step3_universal")  # DeepSpeed's own ds_to_universal output
    param = sorted(os.listdir(os.path.join(theirs, "zero")))[0]
    ours = "universal/global_step3_universal"
    views = [f"{ours}/zero/{param}/fp32.pt", f"{ours}/zero/{param}/exp_avg.pt", f"{ours}/mp_rank_00_model_states.pt",
             "universal/latest_universal"]
    got = check_against_mount(ckptfs_bin, src, views, tmp_path)
    for key in ("fp32", "exp_avg"):
        ref = os.path.join(theirs, "zero", param, f"{key}.pt")
        assert_same(torch_load(got[f"{ours}/zero/{param}/{key}.pt"]), load_pt(ref), f"cat {key}.pt", storage=True)
    assert got[f"{ours}/mp_rank_00_model_states.pt"] == read(os.path.join(theirs, "mp_rank_00_model_states.pt"))
    assert got["universal/latest_universal"] == read(os.path.join(src, "latest_universal"))


def test_side_files_and_info(ckptfs_bin, tmp_path):
    got = check_against_mount(ckptfs_bin, EXAMPLE, ["config.json", "tokenizer.json", "ckptfs.json",
                                                    "fp32/model.safetensors"], tmp_path)
    for side in ("config.json", "tokenizer.json"):
        assert got[side] == read(os.path.join(EXAMPLE, side))
    assert json.loads(got["ckptfs.json"])["framework"] == "deepspeed"


def test_s3_source(s3_gateway, ckptfs_bin, tmp_path):  # noqa: F811
    s3_gateway.make_bucket("ckptfs-cat")
    local = os.path.join(MEGATRON_REAL, "checkpoint")
    s3_gateway.upload_tree(local, "ckptfs-cat", "legacy/checkpoint")
    url = "s3://ckptfs-cat/legacy/checkpoint"
    env = dict(os.environ, **s3_gateway.env())
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        for i, view in enumerate(["hf/model.safetensors", "fp32/pytorch_model.bin", "hf/config.json"]):
            assert cat_both_ways(ckptfs_bin, url, view, tmp_path / f"out{i}", env=env) == read(os.path.join(mnt, view)), view
    H.assert_one_line_error(as_text(cat(ckptfs_bin, url, "hf/model.safetensor", env=env)), H.EXIT_USAGE,
                            ["model.safetensors"])


# ----------------------------------------------------------------------------------------------------
# wrong paths, pipes, failures, memory

def as_text(proc):
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def test_unknown_and_directory_paths_exit_2(ckptfs_bin, generated):
    _, src, info = generated
    latest = info["latest"]
    for view, words in [("fp32/model.safetensor", ["no such file", "fp32/ holds model.safetensors", "inspect"]),
                        ("fp33/model.safetensors", ["no such file", "the root holds fp32/"]),
                        ("fp32/../model.safetensors", ["no such file"]),
                        ("model.safetensors/x", ["no such file", "model.safetensors"]),
                        (f"tags/{latest}x", ["no such file", f"tags/ holds {latest}/"]),
                        ("fp32", ["is a directory", "pytorch_model.bin", "model.safetensors"]),
                        ("/", ["is a directory", "fp32/", "tags/"]),
                        ("universal/", ["is a directory", "latest_universal"])]:
        proc = as_text(cat(ckptfs_bin, src, view))
        H.assert_one_line_error(proc, H.EXIT_USAGE, [view])
        assert proc.stdout == "" and all(w in proc.stderr for w in words), f"{view}: {proc.stderr}"


def test_usage(ckptfs_bin, generated, tmp_path):
    _, src, _ = generated
    helped = H.run([ckptfs_bin, "cat", "--help"])
    assert helped.returncode == 0 and "VIEW_PATH" in helped.stdout and "-o FILE" in helped.stdout
    assert "ckptfs cat SRC VIEW_PATH" in H.run([ckptfs_bin, "--help"]).stdout
    for args in (["cat", src], ["cat", src, "model.safetensors", "--universal"], ["cat", src, "model.safetensors", "-o"],
                 ["export", src, tmp_path / "e", "-o", tmp_path / "x"]):  # -o is cat's alone
        proc = H.run([ckptfs_bin, *args])
        assert proc.returncode == H.EXIT_USAGE and "usage" in proc.stderr, H.describe(proc)
    inside = H.run([ckptfs_bin, "cat", src, "model.safetensors", "-o", os.path.join(src, "model.safetensors")])
    H.assert_one_line_error(inside, H.EXIT_USAGE, ["source"])
    assert not os.path.exists(os.path.join(src, "model.safetensors"))
    H.assert_one_line_error(as_text(cat(ckptfs_bin, src, "model.safetensors", "-o", tmp_path / "no-dir" / "m")),
                            H.EXIT_OUTPUT, ["no-dir"])
    # `-` is stdout
    assert cat(ckptfs_bin, src, "fp32/model.safetensors", "-o", "-").stdout == \
        cat(ckptfs_bin, src, "fp32/model.safetensors").stdout


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    """A torch.save state dict of 160 MiB fp32 (real torch.save): its views are 20 chunks long."""
    path = tmp_path_factory.mktemp("big") / "pytorch_model.bin"
    g = torch.Generator().manual_seed(20)
    state = {"embed.weight": torch.randn(BIG_ELEMENTS // 2048, 1024, generator=g),
             "head.weight": torch.randn(BIG_ELEMENTS // 2048, 1024, generator=g)}
    torch.save(state, path)
    return path, state


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# Runs a command from a fresh interpreter and prints its exit code and peak RSS: measured from this process,
# the RSS would count the pages of this interpreter (torch, the fixture's tensors) that the child had
# between fork and exec.
PEAK_RSS = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")


def peak_rss(args):
    """(exit status, peak RSS in bytes) of a command with stdout discarded."""
    proc = H.run([sys.executable, "-c", PEAK_RSS, *args])
    H.assert_ok(proc)
    code, rss = proc.stdout.split()
    return int(code), int(rss)


def test_memory_stays_bounded(ckptfs_bin, big_source, tmp_path):
    src, state = big_source
    size = None
    for view in ("fp32/model.safetensors", "fp32/pytorch_model.bin"):
        code, rss = peak_rss([ckptfs_bin, "cat", src, view])
        assert code == 0
        code, rss_file = peak_rss([ckptfs_bin, "cat", src, view, "-o", tmp_path / "out"])
        assert code == 0
        size = os.path.getsize(tmp_path / "out")
        assert size > 16 * CHUNK
        # two chunks in flight, plus the binary and the index: far below the view's size
        for peak in (rss, rss_file):
            assert peak < size // 3, f"cat {view}: peak RSS {peak >> 20} MiB for a {size >> 20} MiB view"
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        assert sha256_file(tmp_path / "out") == sha256_file(os.path.join(mnt, "fp32", "pytorch_model.bin"))
    ours = torch.load(tmp_path / "out", map_location="cpu", weights_only=True)
    H.assert_state_equal(ours, state, ordered=True, what="cat fp32/pytorch_model.bin of a torch.save file")


@pytest.mark.parametrize("sigpipe", ["default", "ignored"])
def test_reader_closing_the_pipe_ends_quietly(ckptfs_bin, big_source, tmp_path, sigpipe):
    """`ckptfs cat ... | head -c 10`: head gets the first 10 bytes, ckptfs ends by SIGPIPE as cat does (also
    when it was started with SIGPIPE ignored, and its write failed with EPIPE), with nothing on stderr."""
    src, _ = big_source
    with open(tmp_path / "err", "wb") as err:
        ckptfs = subprocess.Popen([ckptfs_bin, "cat", src, "fp32/model.safetensors"], stdout=subprocess.PIPE,
                                  stderr=err, stdin=subprocess.DEVNULL, restore_signals=(sigpipe == "default"))
        head = subprocess.run(["head", "-c", "10"], stdin=ckptfs.stdout, capture_output=True, timeout=60)
        ckptfs.stdout.close()
        code = ckptfs.wait(timeout=60)
    assert head.returncode == 0 and len(head.stdout) == 10
    assert code == -signal.SIGPIPE, f"exit {code}: {read(tmp_path / 'err')!r}"
    assert read(tmp_path / "err") == b""
    whole = cat(ckptfs_bin, src, "fp32/model.safetensors").stdout
    assert whole[:10] == head.stdout
    shell = subprocess.run(["bash", "-c", f"'{ckptfs_bin}' cat '{src}' fp32/model.safetensors | head -c 10 >/dev/null;"
                            " echo ${PIPESTATUS[0]}"], capture_output=True, text=True, timeout=60)
    assert shell.stdout.strip() == "141" and shell.stderr == "", shell


def stream_then(ckptfs_bin, src, view, damage):
    """Starts `cat SRC VIEW` into a pipe, reads 1 MiB (ckptfs is then blocked writing its first chunk), runs
    `damage`, reads the rest: (bytes read, exit code, stderr)."""
    with subprocess.Popen([ckptfs_bin, "cat", str(src), view], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL) as proc:
        first = proc.stdout.read(1 << 20)
        damage()
        rest = proc.stdout.read()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    return first + rest, code, err


def test_source_truncated_mid_stream(ckptfs_bin, big_source, tmp_path):
    src = tmp_path / "pytorch_model.bin"
    src.write_bytes(read(big_source[0]))
    size = len(cat(ckptfs_bin, src, "fp32/model.safetensors").stdout)
    data, code, err = stream_then(ckptfs_bin, src, "fp32/model.safetensors", lambda: os.truncate(src, 1 << 20))
    assert len(data) < size
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == H.EXIT_SOURCE and len(lines) == 1, f"exit {code}: {err}"
    assert "fp32/model.safetensors" in err and str(src) in err, err


def test_source_rewritten_in_place_mid_stream(ckptfs_bin, big_source, tmp_path):
    """Same size, new bytes: every read succeeds, but the check after the last one finds the file changed."""
    src = tmp_path / "pytorch_model.bin"
    src.write_bytes(read(big_source[0]))

    def rewrite():
        with open(src, "r+b") as f:
            f.seek(os.path.getsize(src) - 4096)
            f.write(b"\x7f" * 4096)

    data, code, err = stream_then(ckptfs_bin, src, "fp32/model.safetensors", rewrite)
    assert code == H.EXIT_SOURCE and "changed while it was read" in err and str(src) in err, f"exit {code}: {err}"


def test_progress_bar_on_a_terminal_only(ckptfs_bin, generated, tmp_path):
    _, src, _ = generated
    code, drawn = H.run_with_terminal_stderr([ckptfs_bin, "cat", src, "fp32/model.safetensors", "-o", tmp_path / "o"])
    assert code == 0 and b"100.0%" in drawn and b"fp32/model.safetensors" in drawn, drawn
    piped = cat(ckptfs_bin, src, "fp32/model.safetensors", "-o", tmp_path / "p")
    assert piped.returncode == 0 and piped.stderr == b""


def test_output_to_a_device_or_fifo_is_written_in_place(ckptfs_bin, tmp_path):
    """`-o /dev/null` (a character device) and `-o FIFO` are written in place: a rename of FILE.partial onto
    them would replace the node itself (a regular file where /dev/null was). Tried on a null device and a FIFO
    of the test's own, never on the machine's /dev/null."""
    null = tmp_path / "null"
    os.mknod(null, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR: the null device's numbers
    proc = cat(ckptfs_bin, EXAMPLE, "model.safetensors", "-o", null)
    assert proc.returncode == 0 and proc.stderr == b"", proc
    assert stat.S_ISCHR(os.stat(null).st_mode) and not os.path.exists(f"{null}.partial")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([ckptfs_bin, "cat", EXAMPLE, "config.json", "-o", fifo], stderr=subprocess.PIPE)
    with open(fifo, "rb") as f:
        got = f.read()
    assert writer.wait(timeout=H.DEFAULT_TIMEOUT) == 0, writer.stderr.read()
    assert got == read(os.path.join(EXAMPLE, "config.json"))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
