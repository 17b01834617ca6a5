"""ckptfs against the real Megatron checkpoints of 2026's stacks (mount_tests/fixtures/megatron-2026-real, see its
README): Megatron-LM 2a75ac12c5 (Megatron-Bridge's pin) torch_dist and Megatron-Bridge 067f987 saves.

- shared_torch_dist_qwen3moe_ep2: a Qwen3-MoE-like model (q/k layernorm, 8 experts top-2) at EP2 (TP1 x DP2),
  torch_dist, non-distributed optimizer (fp32 masters under the model's keys), args in common_state;
- shared_bridge_qwen3_pretrain_tp2: Bridge's own pretrain() of a Qwen3 (q/k norms, head_dim 24) at TP2 with the
  distributed optimizer (dp_reshardable), config only in iter_N/run_config.yaml, tokenizer/ beside it;
- shared_bridge_qwen3moe_import_ep2: Bridge's import of an HF Qwen3-MoE at EP2, model only (moe_grouped_gemm with
  Bridge's local layer spec: SequentialMLP experts).

Each is given as the save dir, the save dir with --tag and the iteration dir, through export and the mount (root and
tags/): model.safetensors against Megatron's (or Bridge's) own TP=1 PP=1 EP=1 load (expected/manifest.json,
expected/full_model.pt); fp32/ where masters were saved (every master rounded to bf16 is the model weight); hf/
against the golden Hugging Face model (expected/hf_llama: every tensor byte for byte, per-expert names, the config
fields that decide what the model computes) and, for Bridge, the tokenizer files of tokenizer/ passed through.
inspect names the stack and the config source. A broken run_config.yaml is exit 4 naming it. The Bridge Qwen3 save
laid out as NeMo-RL's checkpoint dir (step_N/policy/weights/, policy/tokenizer/) mounts a tag per step.
mount_tests/modern/test_megatron_2026.py loads the mounted hf/ with from_pretrained (transformers 5.12).
"""

import json
import os
import shutil
import struct

import pytest

import helpers as H
from test_real_megatron import check_fp32, check_model, check_mount, load_json

REAL_DIR = os.path.join(H.HERE, "fixtures", "megatron-2026-real")
TORCH_DIST_MOE = "shared_torch_dist_qwen3moe_ep2"
BRIDGE_QWEN3 = "shared_bridge_qwen3_pretrain_tp2"
BRIDGE_QWEN3_MOE = "shared_bridge_qwen3moe_import_ep2"
TAG = "iter_0000003"
# case -> (tag, whether it saved fp32 masters, whether Bridge wrote it)
CASES = {TORCH_DIST_MOE: (TAG, True, False), BRIDGE_QWEN3: (TAG, True, True),
         BRIDGE_QWEN3_MOE: ("iter_0000000", False, True)}
# config.json fields that decide what the model computes (the torch_dist case's golden intermediate_size, unused by
# a model whose every layer is sparse, is Bridge's and not in Megatron's args)
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


def views(name):
    return ["model.safetensors", "hf/model.safetensors", "hf/config.json"] + (
        ["fp32/model.safetensors", "fp32/pytorch_model.bin"] if CASES[name][1] else [])


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


def check_tokenizer(d, name, what):
    """Bridge keeps the HF tokenizer in iter_N/tokenizer/: hf/ passes its files through byte for byte."""
    tok = case_path(name, "checkpoint", CASES[name][0], "tokenizer")
    assert sorted(os.listdir(tok)) == ["tokenizer.json", "tokenizer_config.json"]
    same_files = [f for f in os.listdir(tok) if open(os.path.join(tok, f), "rb").read() ==
                  open(os.path.join(d, "hf", f), "rb").read()]
    assert sorted(same_files) == sorted(os.listdir(tok)), f"{what}: hf/ tokenizer files differ from tokenizer/"


def check_views(name):
    def check(d, what):
        model = check_model(d, name, what, real_dir=REAL_DIR)
        assert not [k for k in model if "optimizer" in k or k.startswith("chained_")], f"{what}: optimizer state"
        if CASES[name][1]:
            check_fp32(d, model, what)
        else:
            assert not os.path.exists(os.path.join(d, "fp32")), f"{what}: fp32/ without saved masters"
        check_hf(d, name, what)
        if CASES[name][2]:
            check_tokenizer(d, name, what)
    return check


def test_real_2026_fixtures_present():
    for name in CASES:
        for f in ("expected/manifest.json", "expected/full_model.pt", "expected/hf_llama/model.safetensors",
                  "checkpoint/latest_checkpointed_iteration.txt"):
            assert os.path.isfile(case_path(name, f)), f"missing real fixture file {name}/{f}"


@pytest.mark.parametrize("name", CASES)
def test_export_matches_the_framework(export_cache, name):
    for label, src, tag in sources(name, CASES[name][0]):
        proc, out = export_cache(src, tag)
        H.assert_ok(proc)
        check_views(name)(str(out), f"{name} export ({label})")


@pytest.mark.parametrize("name", CASES)
def test_mount_matches_the_framework(export_cache, ckptfs_bin, tmp_path, name):
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", case_path(name, "checkpoint"), CASES[name][0],
                check_views(name), views(name), name)


@pytest.mark.parametrize("name", CASES)
def test_inspect_names_the_stack_config_source_and_family(ckptfs_bin, name):
    tag, _, bridge = CASES[name]
    proc = H.run([ckptfs_bin, "inspect", case_path(name, "checkpoint"), "--json"])
    H.assert_ok(proc)
    info = json.loads(proc.stdout)
    assert info["framework"] == "megatron", info
    t = info["tags"][0]
    assert t["name"] == tag, t
    want = "Megatron-Bridge checkpoint (torch_dist; model config: run_config.yaml" if bridge else \
        "Megatron-LM checkpoint (torch_dist)"
    assert t["format"].startswith(want), t["format"]
    topo = t["topology"]
    args = load_json(case_path(name, "expected", "args.json"))
    model = args.get("model", args)  # Bridge: the run_config.yaml; Megatron: its args
    assert (topo["tp"], topo["pp"]) == (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"])
    if not bridge:
        assert topo["dp"] == 2, topo
    # and the Hugging Face family hf/ serves, as the golden HF model's config.json names it
    golden = load_json(case_path(name, "expected", "hf_llama", "config.json"))
    family = f"hf/: the model as Hugging Face's {golden['architectures'][0]} ({golden['model_type']})"
    assert family in t["notes"], t["notes"]


@pytest.mark.parametrize("change, field", [
    (lambda text: text.replace("\nmodel:\n", "\nmodel_missing:\n"), "no model: mapping"),
    (lambda text: text.replace("  num_layers: 4\n", ""), "model.num_layers: missing"),
    (lambda text: text.replace("  hidden_size: 64\n", "  hidden_size: wide\n"), "model.hidden_size: expected an integer"),
    (lambda text: text.replace("  num_attention_heads: 4\n", "  num_attention_heads: 0\n"),
     "model.num_attention_heads: 0, expected a positive integer"),
    (lambda text: text + "\n  - [unbalanced\n", "not YAML"),
])
def test_broken_run_config_is_exit_4_naming_it(ckptfs_bin, tmp_path, change, field):
    save = tmp_path / "save"
    shutil.copytree(case_path(BRIDGE_QWEN3, "checkpoint"), save)
    run_config = save / TAG / "run_config.yaml"
    text = run_config.read_text()
    changed = change(text)
    assert changed != text
    run_config.chmod(0o644)
    run_config.write_text(changed)
    proc = H.run([ckptfs_bin, "inspect", save])
    H.assert_one_line_error(proc, H.EXIT_INVALID, ["run_config.yaml"])
    assert field in proc.stderr, proc.stderr


def nemo_rl_checkpoint_dir(tmp_path):
    """The real Bridge Qwen3 save laid out as NeMo-RL's Megatron policy saves it (NVIDIA-NeMo/RL
    nemo_rl/utils/checkpoint.py CheckpointManager, megatron_policy_worker.save_checkpoint, grpo.py): step_N/ with
    training_info.json and config.yaml, policy/weights/ the Bridge save dir (Bridge's save_checkpoint with
    checkpoint.save = weights_path), policy/tokenizer/ the HF tokenizer; plus a tmp_step_N/ being written (NeMo-RL
    renames it to step_N/ once complete), which is not a tag."""
    ck = tmp_path / "checkpoints"
    step = ck / "step_3"
    shutil.copytree(case_path(BRIDGE_QWEN3, "checkpoint"), step / "policy" / "weights")
    (step / "policy" / "weights" / TAG / "tokenizer").rename(step / "policy" / "tokenizer")
    (step / "training_info.json").write_text('{"step": 3}')
    (step / "config.yaml").write_text("policy:\n  megatron_cfg:\n    enabled: true\n")
    partial = ck / "tmp_step_6" / "policy" / "weights" / "iter_0000000"
    partial.mkdir(parents=True)
    (partial / ".metadata").write_bytes(b"")
    return ck


def test_nemo_rl_layout_mounts_each_step(export_cache, ckptfs_bin, tmp_path):
    ck = nemo_rl_checkpoint_dir(tmp_path)
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", ck, "step_3", check_views(BRIDGE_QWEN3),
                views(BRIDGE_QWEN3) + ["training_info.json"], "NeMo-RL checkpoint dir")
    step = ck / "step_3"
    for label, src in (("step dir", step), ("policy/weights", step / "policy" / "weights")):
        proc, out = export_cache(src)
        H.assert_ok(proc)
        if label == "step dir":  # the tokenizer comes from policy/tokenizer/
            check_views(BRIDGE_QWEN3)(str(out), f"NeMo-RL {label} export")
        else:
            check_model(str(out), BRIDGE_QWEN3, f"NeMo-RL {label} export", real_dir=REAL_DIR)
    proc = H.run([ckptfs_bin, "inspect", ck, "--json"])
    H.assert_ok(proc)
    t = json.loads(proc.stdout)["tags"]
    assert [x["name"] for x in t] == ["step_3"], t
    assert t[0]["format"].startswith("NeMo-RL step (policy/weights/: Megatron-Bridge checkpoint"), t[0]["format"]
