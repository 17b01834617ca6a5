"""Sharded safetensors views (-o shard_size=SIZE, export --shard-size SIZE) against the real
save_pretrained(max_shard_size=SIZE) of transformers 5.x in the Debian unstable chroot.

For each case and SIZE, every safetensors view larger than SIZE is served as save_pretrained writes it:
chroot_save_pretrained.py (mount_tests/modern/) makes AutoModelForCausalLM.from_config(the case's config.json,
dtype of the view) hold the tensors of VIEW/unsharded/model.safetensors, calls save_pretrained(OUT,
max_shard_size=SIZE) and compares OUT's model-0000I-of-0000N.safetensors and model.safetensors.index.json
with the view's, byte for byte (same names, at least 3 shards); then from_pretrained(VIEW) (through the
index) loads the reference model's tensors bit for bit.  Cases: the DeepSpeed ZeRO-3 Llama (mount_tests/gen:
model.safetensors in bf16 and fp32/model.safetensors, at the root and under tags/<tag>/) at four SIZEs
spelt four ways ("30KB", "0.05MB", 64KiB (save_pretrained is given 65536: its parser has no binary units)
and plain bytes), and the hf/ views of three generated Megatron cases (Llama, Qwen2-style with q/k/v biases
and tied embeddings, GPT-2-style fp16 with tied embeddings and transposed Conv1D weights) at two SIZEs.

Without the chroot these tests fail saying so, unless CKPTFS_SKIP_MODERN=1 (then they are skipped).  The
rest runs on the host: the single file stays available under unsharded/ (equal to the unsharded mount's
model.safetensors), export --shard-size writes the mount's shards and index (and no unsharded/), and a bad
SIZE is exit 2 with a one-line message.
"""
import glob
import json
import math
import os
import shutil
import sys

import pytest
import torch

import helpers as H
from conftest import case_info, case_source, generate_only
from mounting import mounted, run_ckptfs
from test_megatron import GENERATOR as MEGATRON_GENERATOR, _fixtures_root as megatron_root, source_of

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "modern"))
from test_modern_clients import chroot_versions, in_chroot  # noqa: E402

SID = os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))
SCRIPTS = [os.path.join(HERE, "modern", "chroot_save_pretrained.py"), os.path.join(HERE, "modern", "chroot_clients.py")]
LLAMA = "llama_z3_bf16_dp2"  # 78144 parameters: 156 kB in bf16, 313 kB in fp32; the largest tensors 16 / 32 kB
# (-o shard_size=, what save_pretrained is given)
LLAMA_SIZES = [("30KB", "30KB"), ("0.05MB", "0.05MB"), ("64KiB", 65536), ("45000", 45000)]
MEGATRON = ["llama_tp2_pp2_dp4", "te_qkvbias_tp4_tied", "gpt_fp16_tp2_pp2_tied"]
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def llama():
    return case_source(generate_only([LLAMA]), LLAMA)


@pytest.fixture(scope="module")
def megatron_cases():
    root = megatron_root()
    H.assert_ok(H.run([sys.executable, MEGATRON_GENERATOR, root, "--only", *MEGATRON], timeout=600))
    return root


@pytest.fixture
def sid(tmp_path):
    """stage(name) -> (host folder, its path inside the chroot) under SID/tmp or SID/mnt (mount points); all
    removed after the test."""
    if os.environ.get("CKPTFS_SKIP_MODERN") == "1":
        pytest.skip("CKPTFS_SKIP_MODERN=1")
    versions = chroot_versions(SID)
    if versions is None or versions.get("transformers", "absent") == "absent":
        pytest.fail(f"the Debian unstable chroot with transformers is not set up at {SID} (stamp: {versions}): "
                    f"run `CKPTFS_CHROOT={SID} CKPTFS_CHROOT_SUITE=sid bash mount_tests/modern/setup_chroot.sh`, "
                    f"point CKPTFS_SID_CHROOT at one, or set CKPTFS_SKIP_MODERN=1", pytrace=False)
    made = []

    def stage(kind, name):
        inside = f"/{kind}/ckptfs-shard-{os.getpid()}-{name}"
        host = SID + inside
        shutil.rmtree(host, ignore_errors=True)
        os.makedirs(host)
        made.append(host)
        return host, inside

    yield stage
    for p in reversed(made):
        if not os.path.ismount(p):
            shutil.rmtree(p, ignore_errors=True)


def run_jobs(sid, name, jobs):
    """Runs chroot_save_pretrained.py on `jobs` (paths inside the chroot); asserts every check passed."""
    host, inside = sid("tmp", name)
    for s in SCRIPTS:
        shutil.copy(s, host)
    for i, job in enumerate(jobs):
        job["out"] = f"{inside}/ref{i}"
    with open(os.path.join(host, "jobs.json"), "w") as f:
        json.dump(jobs, f)
    proc = in_chroot(SID, "python3", f"{inside}/chroot_save_pretrained.py", f"{inside}/jobs.json")
    print(proc.stdout)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, H.describe(proc)
    assert proc.stdout.count("PASS ") == 2 * len(jobs), H.describe(proc)


def test_deepspeed_llama_views_are_what_save_pretrained_writes(sid, ckptfs_bin, llama):
    jobs, mounts = [], []
    tag = case_info(os.path.dirname(os.path.dirname(llama)), LLAMA)["latest"]
    for i, (size, given) in enumerate(LLAMA_SIZES):
        mnt, mnt_inside = sid("mnt", f"{LLAMA}-{i}")
        mounts.append((mnt, size))
        views = ["", "fp32"] + ([f"tags/{tag}", f"tags/{tag}/fp32"] if i == 0 else [])
        jobs += [{"label": f"-o shard_size={size} {view or '/'}", "view": f"{mnt_inside}/{view}".rstrip("/"),
                  "config": mnt_inside, "size": given, "min_shards": 3} for view in views]
    with mounted(ckptfs_bin, llama, mounts[0][0], "-o", f"shard_size={mounts[0][1]}"), \
            mounted(ckptfs_bin, llama, mounts[1][0], "-o", f"shard_size={mounts[1][1]}"), \
            mounted(ckptfs_bin, llama, mounts[2][0], "-o", f"shard_size={mounts[2][1]}"), \
            mounted(ckptfs_bin, llama, mounts[3][0], "-o", f"shard_size={mounts[3][1]}"):
        assert not os.path.exists(os.path.join(mounts[0][0], "model.safetensors"))
        run_jobs(sid, LLAMA, jobs)


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_hf_view_is_what_save_pretrained_writes(sid, ckptfs_bin, megatron_cases, name):
    src = source_of(megatron_cases, name)
    mnt_a, inside_a = sid("mnt", f"{name}-a")
    mnt_b, inside_b = sid("mnt", f"{name}-b")
    with mounted(ckptfs_bin, src, mnt_a):
        total = os.path.getsize(os.path.join(mnt_a, "hf", "model.safetensors"))
        tag = os.listdir(os.path.join(mnt_a, "tags"))[0]
    # a quarter of the model in plain bytes, and a third of it in decimal kB
    sizes = [str(total // 4), f"{total / 3 / 1000:.3f}KB"]
    given = [total // 4, sizes[1]]
    jobs = [{"label": f"{name} -o shard_size={sizes[0]} hf/", "view": f"{inside_a}/hf", "config": f"{inside_a}/hf",
             "size": given[0], "min_shards": 3},
            {"label": f"{name} -o shard_size={sizes[0]} tags/{tag}/hf/", "view": f"{inside_a}/tags/{tag}/hf",
             "config": f"{inside_a}/hf", "size": given[0], "min_shards": 3},
            {"label": f"{name} -o shard_size={sizes[1]} hf/", "view": f"{inside_b}/hf", "config": f"{inside_b}/hf",
             "size": given[1], "min_shards": 3}]
    with mounted(ckptfs_bin, src, mnt_a, "-o", f"shard_size={sizes[0]}"), \
            mounted(ckptfs_bin, src, mnt_b, "-o", f"shard_size={sizes[1]}"):
        run_jobs(sid, name, jobs)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def weight_files(folder):
    return sorted(f for f in os.listdir(folder) if f.startswith("model") and ".safetensors" in f)


def test_single_file_stays_under_unsharded(ckptfs_bin, llama, tmp_path):
    with mounted(ckptfs_bin, llama, tmp_path / "whole") as whole, \
            mounted(ckptfs_bin, llama, tmp_path / "sharded", "-o", "shard_size=40KB") as sharded:
        for view in ["", "fp32"]:
            assert weight_files(os.path.join(whole, view)) == ["model.safetensors"]
            shards = weight_files(os.path.join(sharded, view))
            assert INDEX in shards and "model.safetensors" not in shards and len(shards) >= 4, shards
            assert read(os.path.join(sharded, view, "unsharded", "model.safetensors")) == \
                read(os.path.join(whole, view, "model.safetensors"))
        with open(os.path.join(sharded, "ckptfs.json")) as f:
            listed = {v["path"] for v in json.load(f)["tags"][0]["views"]}
        assert {INDEX, "unsharded/model.safetensors", "fp32/" + INDEX, "fp32/pytorch_model.bin"} <= listed, listed


@pytest.mark.parametrize("case", ["z2_bf16_dp2", "z3_bf16_dp2"])
def test_total_parameters_count_each_parameter_once_and_no_buffer(ckptfs_bin, tmp_path, case):
    """save_pretrained's total_parameters is model.num_parameters(): each parameter once, no buffer. DeepSpeed's
    model states name the buffers (buffer_names) and the tied parameters (shared_params): the index of the
    model and fp32 views counts what its param_shapes and frozen_param_shapes list, read here with torch."""
    src = case_source(generate_only([case]), case)
    states = sorted(glob.glob(os.path.join(H.resolve_tag_dir(src), "*model_states.pt")))
    first = torch.load(states[0], map_location="cpu", weights_only=False)
    assert first["buffer_names"] and first["shared_params"], "the case must have buffers and a tied parameter"
    shapes = [s for group in first["param_shapes"] for s in group.values()]
    shapes += list((first["frozen_param_shapes"] or {}).values())
    parameters = sum(math.prod(s) for s in shapes)
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", "shard_size=1KB") as mnt:
        for view in ["", "fp32"]:
            with open(os.path.join(mnt, view, INDEX)) as f:
                index = json.load(f)
            assert index["metadata"]["total_parameters"] == parameters, (view, parameters)
            assert set(first["buffer_names"]) <= set(index["weight_map"]), "buffers stay in the files"


def test_export_shard_size_writes_the_mounts_shards(ckptfs_bin, llama, tmp_path):
    out = tmp_path / "out"
    H.assert_ok(H.run([ckptfs_bin, "export", llama, out, "--shard-size", "40KB"]))
    assert not os.path.exists(out / "unsharded") and not os.path.exists(out / "fp32" / "unsharded")
    with mounted(ckptfs_bin, llama, tmp_path / "mnt", "-o", "shard_size=40KB") as mnt:
        for view in ["", "fp32"]:
            names = weight_files(os.path.join(mnt, view))
            assert weight_files(out / view) == names and len(names) >= 4
            for n in names:
                assert read(out / view / n) == read(os.path.join(mnt, view, n)), f"{view}/{n}"
        assert read(out / "fp32" / "pytorch_model.bin") == read(os.path.join(mnt, "fp32", "pytorch_model.bin"))


@pytest.mark.parametrize("size", ["5XB", "1.5GiB", "-1GB", "GB", ""])
def test_bad_size_is_a_usage_error(ckptfs_bin, llama, tmp_path, size):
    proc = H.run([ckptfs_bin, "export", llama, tmp_path / "out", "--shard-size", size])
    H.assert_one_line_error(proc, H.EXIT_USAGE, ["--shard-size"])
    assert f"'{size}' is not a size" in proc.stderr and not os.path.exists(tmp_path / "out"), proc.stderr
    os.makedirs(tmp_path / "mnt")
    proc = run_ckptfs(ckptfs_bin, llama, tmp_path / "mnt", "-o", f"shard_size={size}")
    H.assert_one_line_error(proc, H.EXIT_USAGE, ["shard_size"])
    assert f"'{size}' is not a size" in proc.stderr and not os.listdir(tmp_path / "mnt"), proc.stderr


@pytest.mark.parametrize("command", [["inspect"], ["index", "--cache", "CACHE"], ["cat", "VIEW"]])
def test_shard_size_elsewhere_is_an_unknown_option(ckptfs_bin, llama, tmp_path, command):
    # only export (and the mount's -o shard_size=) shard: another command must not accept and ignore it
    args = [str(tmp_path / "cache") if a == "CACHE" else "model.safetensors" if a == "VIEW" else a for a in command]
    r = H.run([ckptfs_bin, args[0], llama, *args[1:], "--shard-size", "40KB"])
    assert r.returncode == 2, r
    assert "--shard-size" in r.stderr, r.stderr
