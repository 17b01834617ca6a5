"""ckptfs on a Mixture-of-Experts checkpoint written by real DeepSpeed 0.19.5
(mount_tests/fixtures/deepspeed-0.19-real/moe_ep2_z2_bf16_ws2: deepspeed.moe.layer.MoE, 2 experts, ep_size 2,
ZeRO-2, bf16, 2 ranks).  DeepSpeed's zero_to_fp32 and ds_to_universal both fail on it; the references are
DeepSpeed's own load_checkpoint + safe_get_full_fp32_param (golden_fp32.*) and the 16-bit weights every rank
holds after that load (model_16bit/), experts under their global ids.  Every view is checked through export
and through the mount, at the root and under tags/."""
import json
import os
import subprocess

import pytest
import torch

import helpers as H
from mounting import CMD_TIMEOUT, mounted

CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "deepspeed-0.19-real",
                    "moe_ep2_z2_bf16_ws2")
SRC = os.path.join(CASE, "checkpoint")
TAG = "global_step3"
VIEWS = ["model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors"]
EXPERTS = "block1.moe.deepspeed_moe.experts.deepspeed_experts."
DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load(*parts):
    return torch.load(os.path.join(CASE, *parts), map_location="cpu", weights_only=True)


def manifest(*parts):
    with open(os.path.join(CASE, *parts)) as f:
        return json.load(f)


def assert_matches_manifest(what, tensors, ref):
    assert sorted(tensors) == sorted(ref), f"{what}: names differ: ours-only {sorted(set(tensors) - set(ref))}, " \
                                           f"reference-only {sorted(set(ref) - set(tensors))}"
    for k, m in ref.items():
        t = tensors[k]
        assert (t.dtype, list(t.shape)) == (DTYPE[m["dtype"]], m["shape"]), f"{what} {k}: {t.dtype} {list(t.shape)}"
        assert H.sha256_le(t) == m["sha256"], f"{what} {k}: bytes differ from the reference"


def check_views(d, what):
    """fp32/ = golden_fp32 (DeepSpeed's order: buffer, then every param in module order, the experts in global
    id order where the MoE module holds them), model.safetensors = model_16bit."""
    fp32 = torch.load(os.path.join(d, "fp32", "pytorch_model.bin"), map_location="cpu", weights_only=True)
    H.assert_state_equal(fp32, load("golden_fp32.pt"), ordered=True, what=f"{what} fp32/pytorch_model.bin")
    assert_matches_manifest(f"{what} fp32/pytorch_model.bin", fp32, manifest("golden_fp32.manifest.json"))
    H.assert_state_equal(H.read_safetensors(os.path.join(d, "fp32", "model.safetensors")), fp32, ordered=False,
                         what=f"{what} fp32/model.safetensors")
    model = H.read_safetensors(os.path.join(d, "model.safetensors"))
    H.assert_state_equal(model, load("model_16bit", "pytorch_model.bin"), ordered=False,
                         what=f"{what} model.safetensors")
    assert_matches_manifest(f"{what} model.safetensors", model, manifest("model_16bit", "pytorch_model.manifest.json"))


def test_fixture_is_the_shared_moe_case():
    names = sorted(os.listdir(os.path.join(SRC, TAG)))
    assert names == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                     "layer_0_expert_0_mp_rank_00_model_states.pt", "layer_0_expert_1_mp_rank_00_model_states.pt",
                     "mp_rank_00_model_states.pt"], names


def test_export_matches_deepspeed_load(export_cache):
    proc, out = export_cache(SRC)
    H.assert_ok(proc)
    got = sorted(os.path.relpath(os.path.join(dp, f), out) for dp, _, fs in os.walk(out) for f in fs)
    assert got == sorted(VIEWS), f"export wrote {got} (no universal/ for MoE)"
    check_views(str(out), "export")


def test_experts_are_the_expert_files(export_cache):
    """Every expert weight is the tensor of its layer_0_expert_{id} file, under that file's (global) key."""
    proc, out = export_cache(SRC)
    H.assert_ok(proc)
    model = H.read_safetensors(os.path.join(out, "model.safetensors"))
    expected = {}
    for e in (0, 1):
        experts = load("checkpoint", TAG, f"layer_0_expert_{e}_mp_rank_00_model_states.pt")
        assert experts and all(k.startswith(f"{EXPERTS}{e}.") for k in experts), list(experts)
        expected.update(experts)
    H.assert_state_equal({k: v for k, v in model.items() if k.startswith(EXPERTS)}, expected, ordered=False,
                         what="model.safetensors experts vs the expert files")


def test_mount_matches_deepspeed_load(export_cache, ckptfs_bin, tmp_path):
    proc, out = export_cache(SRC)
    H.assert_ok(proc)
    with mounted(ckptfs_bin, SRC, tmp_path / "mnt") as mnt:
        assert sorted(os.listdir(mnt)) == ["ckptfs.json", "fp32", "model.safetensors", "tags"]
        assert os.listdir(os.path.join(mnt, "tags")) == [TAG]
        for rel in (".", os.path.join("tags", TAG)):
            d = os.path.join(mnt, rel)
            check_views(d, f"mount {rel}")
            for v in VIEWS:
                r = subprocess.run(["cmp", os.path.join(d, v), os.path.join(out, v)], capture_output=True, text=True,
                                   timeout=CMD_TIMEOUT)
                assert r.returncode == 0, f"mount {rel}/{v} vs export: {r.stdout}{r.stderr}"


def test_inspect_shows_expert_parallelism(ckptfs_bin):
    proc = H.run([ckptfs_bin, "inspect", SRC, "--json"])
    H.assert_ok(proc)
    tag = json.loads(proc.stdout)["tags"][0]
    topo = tag["topology"]
    assert (topo["zero_stage"], topo["dp"], topo["ep"], topo["experts"]) == (2, 2, 2, 2), topo
    assert any(n.startswith("no universal/: Mixture-of-Experts") for n in tag["notes"]), tag["notes"]
    text = H.run([ckptfs_bin, "inspect", SRC])
    H.assert_ok(text)
    assert "EP 2 (2 experts)" in text.stdout, text.stdout


def test_mount_info_keeps_expert_parallelism(ckptfs_bin, tmp_path):
    """ckptfs.json of the mount: the second mount is served from the index the first one cached."""
    for i in range(2):
        with mounted(ckptfs_bin, SRC, tmp_path / f"mnt{i}") as mnt:
            with open(os.path.join(mnt, "ckptfs.json")) as f:
                topo = json.load(f)["tags"][0]["topology"]
            assert (topo["ep"], topo["experts"]) == (2, 2), f"mount {i}: {topo}"


@pytest.mark.parametrize("missing", ["layer_0_expert_1_mp_rank_00_model_states.pt",
                                     "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"])
def test_missing_rank_file_is_named(ckptfs_bin, tmp_path, missing):
    src = tmp_path / "checkpoint"
    subprocess.run(["cp", "-r", SRC, str(src)], check=True, timeout=CMD_TIMEOUT)
    os.unlink(src / TAG / missing)
    H.assert_one_line_error(H.run([ckptfs_bin, "export", str(src), str(tmp_path / "out")]), H.EXIT_INVALID,
                            [missing])
