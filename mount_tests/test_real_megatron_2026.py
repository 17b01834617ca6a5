"""ckptfs against the real Megatron checkpoints of 2026's stacks (mount_tests/fixtures/megatron-2026-real, see its
README): Megatron-LM 2a75ac12c5 (Megatron-Bridge's pin) torch_dist and Megatron-Bridge 067f987 saves.

- shared_torch_dist_qwen3moe_ep2: a Qwen3-MoE-like model (q/k layernorm, 8 experts top-2) at EP2 (TP1 x DP2),
  torch_dist, non-distributed optimizer (fp32 masters under the model's keys). model.safetensors is checked
  against Megatron's own TP=1 PP=1 EP=1 load (expected/manifest.json, expected/full_model.pt), fp32/ against the
  model (every master rounded to bf16 is the model weight), through export (save dir, --tag, iteration dir) and
  the mount (root and tags/); inspect says megatron, DP 2.

The same case with its optimizer state replaced by a MoE distributed optimizer's chained_0./chained_1. keys
(issue 32's silent error) is mount_tests/modern/test_megatron_2026.py: it needs torch 2.14's DCP writer.
"""
import json
import os

import pytest

import helpers as H
from test_real_megatron import check_fp32, check_model, check_mount

REAL_DIR = os.path.join(H.HERE, "fixtures", "megatron-2026-real")
TORCH_DIST_MOE = "shared_torch_dist_qwen3moe_ep2"
TAG = "iter_0000003"
VIEWS = ["model.safetensors", "fp32/model.safetensors", "fp32/pytorch_model.bin"]


def case_path(name, *parts):
    return os.path.join(REAL_DIR, name, *parts)


def sources(name, tag):
    save = case_path(name, "checkpoint")
    return [("save dir", save, None), (f"save dir --tag {tag}", save, tag), ("iteration dir", os.path.join(save, tag), None)]


def check_moe_views(d, what):
    model = check_model(d, TORCH_DIST_MOE, what, real_dir=REAL_DIR)
    assert not [k for k in model if "optimizer" in k or k.startswith("chained_")], f"{what}: optimizer state as weights"
    check_fp32(d, model, what)


def test_real_2026_fixtures_present():
    for name in ("shared_torch_dist_qwen3moe_ep2", "shared_bridge_qwen3_pretrain_tp2", "shared_bridge_qwen3moe_import_ep2"):
        for f in ("expected/manifest.json", "expected/full_model.pt", "expected/hf_llama/model.safetensors",
                  "checkpoint/latest_checkpointed_iteration.txt"):
            assert os.path.isfile(case_path(name, f)), f"missing real fixture file {name}/{f}"


def test_torch_dist_moe_export_matches_megatron(export_cache):
    for label, src, tag in sources(TORCH_DIST_MOE, TAG):
        proc, out = export_cache(src, tag)
        H.assert_ok(proc)
        check_moe_views(str(out), f"{TORCH_DIST_MOE} export ({label})")


def test_torch_dist_moe_mount_matches_megatron(export_cache, ckptfs_bin, tmp_path):
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", case_path(TORCH_DIST_MOE, "checkpoint"), TAG,
                check_moe_views, VIEWS, TORCH_DIST_MOE)


def test_torch_dist_moe_inspect(ckptfs_bin):
    proc = H.run([ckptfs_bin, "inspect", case_path(TORCH_DIST_MOE, "checkpoint"), "--json"])
    H.assert_ok(proc)
    info = json.loads(proc.stdout)
    assert info["framework"] == "megatron", info
    topo = info["tags"][0]["topology"]
    assert (topo["dp"], topo["tp"], topo["pp"]) == (2, 1, 1), topo
