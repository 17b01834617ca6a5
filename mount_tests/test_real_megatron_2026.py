"""ckptfs against the real Megatron checkpoints of 2026's stacks (mount_tests/fixtures/megatron-2026-real, see its
README): Megatron-LM 2a75ac12c5 (Megatron-Bridge's pin) torch_dist and Megatron-Bridge 067f987 saves.

- shared_torch_dist_qwen3moe_ep2: a Qwen3-MoE-like model (q/k layernorm, 8 experts top-2) at EP2 (TP1 x DP2),
  torch_dist, non-distributed optimizer (fp32 masters under the model's keys). model.safetensors is checked
  against Megatron's own TP=1 PP=1 EP=1 load (expected/manifest.json, expected/full_model.pt), fp32/ against the
  model (every master rounded to bf16 is the model weight), hf/ against the golden Qwen3MoeForCausalLM
  (expected/hf_llama, Bridge's Qwen3-MoE mapping: every tensor byte for byte, per-expert names), through export
  (save dir, --tag, iteration dir) and the mount (root and tags/); inspect says megatron, DP 2.
  mount_tests/modern/test_megatron_2026.py loads the mounted hf/ with from_pretrained (transformers 5.12).

The same case with its optimizer state replaced by a MoE distributed optimizer's chained_0./chained_1. keys
(issue 32's silent error) is mount_tests/modern/test_megatron_2026.py: it needs torch 2.14's DCP writer.
"""
import json
import os
import struct

import pytest

import helpers as H
from test_real_megatron import check_fp32, check_model, check_mount, load_json

REAL_DIR = os.path.join(H.HERE, "fixtures", "megatron-2026-real")
TORCH_DIST_MOE = "shared_torch_dist_qwen3moe_ep2"
TAG = "iter_0000003"
VIEWS = ["model.safetensors", "fp32/model.safetensors", "fp32/pytorch_model.bin", "hf/model.safetensors",
         "hf/config.json"]
# config.json fields that decide what the model computes (the golden's intermediate_size, unused by a model
# whose every layer is sparse, is Bridge's and not in Megatron's args)
HF_CONFIG_FIELDS = {
    "Qwen3MoeForCausalLM": ["architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                            "rope_parameters", "vocab_size", "tie_word_embeddings", "attention_bias",
                            "moe_intermediate_size", "num_local_experts", "num_experts_per_tok", "norm_topk_prob",
                            "decoder_sparse_step", "mlp_only_layers", "use_sliding_window", "dtype"],
}
HF_CONFIG_FIELDS["Qwen3ForCausalLM"] = [f for f in HF_CONFIG_FIELDS["Qwen3MoeForCausalLM"] if not (
    f.startswith("moe_") or "expert" in f or f in ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"))] + [
    "intermediate_size"]


def case_path(name, *parts):
    return os.path.join(REAL_DIR, name, *parts)


def sources(name, tag):
    save = case_path(name, "checkpoint")
    return [("save dir", save, None), (f"save dir --tag {tag}", save, tag), ("iteration dir", os.path.join(save, tag), None)]


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def check_hf(d, name, what):
    """hf/ against the case's golden Hugging Face model (expected/hf_llama): every tensor's name, dtype, shape and
    bytes, laid out as in the golden file (the golden lacks only save_pretrained's {"format": "pt"} metadata), and
    the config fields that decide what the model computes."""
    ref_dir = case_path(name, "expected", "hf_llama")
    ours, ref = os.path.join(d, "hf", "model.safetensors"), os.path.join(ref_dir, "model.safetensors")
    H.read_safetensors(ours)  # a valid file (the golden's own header has no metadata for this parser)
    head, ref_head = safetensors_header(ours), safetensors_header(ref)
    assert head.pop("__metadata__", None) == {"format": "pt"}, f"{what}: hf/model.safetensors metadata"
    assert head == ref_head, f"{what}: hf/model.safetensors header differs from the golden's beyond its metadata"
    with open(ours, "rb") as a, open(ref, "rb") as b:  # the tensor bytes, whole, after the headers
        a.seek(8 + struct.unpack("<Q", a.read(8))[0])
        b.seek(8 + struct.unpack("<Q", b.read(8))[0])
        assert a.read() == b.read(), f"{what}: hf/model.safetensors data differs from the golden's"
    cfg, ref_cfg = load_json(os.path.join(d, "hf", "config.json")), load_json(os.path.join(ref_dir, "config.json"))
    for f in HF_CONFIG_FIELDS[ref_cfg["architectures"][0]]:
        assert cfg.get(f) == ref_cfg[f], f"{what} hf/config.json {f}: {cfg.get(f)!r}, golden {ref_cfg[f]!r}"


def check_moe_views(d, what):
    model = check_model(d, TORCH_DIST_MOE, what, real_dir=REAL_DIR)
    assert not [k for k in model if "optimizer" in k or k.startswith("chained_")], f"{what}: optimizer state as weights"
    check_fp32(d, model, what)
    check_hf(d, TORCH_DIST_MOE, what)


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
