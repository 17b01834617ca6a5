"""ckptfs against Megatron checkpoints written by Megatron-LM's own code (mount_tests/fixtures/megatron-core-gen,
made by mount_tests/gen_megatron_core: Megatron-LM 2a75ac12c5's GPTModel, optimizer and save_checkpoint on CPU,
one gloo process per rank): Qwen3-MoE at TP2 x EP2 with expert TP 2 and at PP2 x EP2, Mixtral-style MoE at PP2 x EP2
(torch_dist) and EP2 (legacy), Qwen3 dense at TP2 x PP2 in both formats, a MoE save with the distributed optimizer
(ChainedOptimizer: chained_N. keys), a MoE model with a dense layer, shared experts and the router's fp32 expert
bias, Qwen2-MoE (q/k/v biases, a gated shared expert, softmax before the top-k), and a legacy MoE save with expert
TP 2 != TP 1, which ckptfs must refuse.

Each case through export and the mount (root and tags/), given as the save dir, with --tag and as the iteration
dir: model.safetensors against Megatron's own load of the save at TP=1 PP=1 EP=1 (expected/manifest.json,
expected/full_model.pt); fp32/ against the masters Megatron's dist_checkpointing.load reads back at world size 1
(expected/fp32.pt; none where no optimizer was saved, or for the distributed optimizer's chained layout, which
ckptfs does not serve as fp32/); inspect's topology; hf/ for the families ckptfs maps (its config's architecture).
mount_tests/modern/test_megatron_core_hf.py loads hf/ with transformers and compares Megatron's logits.
"""
import json
import os

import pytest
import torch

import helpers as H
from test_real_megatron import check_mount, load_json, masters_round_to_model
from test_real_megatron import check_model as check_manifest_model

GEN_DIR = os.path.join(H.HERE, "fixtures", "megatron-core-gen")
CASES = sorted(d for d in os.listdir(GEN_DIR) if os.path.isdir(os.path.join(GEN_DIR, d))) \
    if os.path.isdir(GEN_DIR) else []
# family (cases.py) -> the Hugging Face architecture hf/ serves it as; families ckptfs does not map have no hf/
HF_ARCHITECTURES = {"Qwen3": "Qwen3ForCausalLM", "Qwen3-MoE": "Qwen3MoeForCausalLM",
                    "Mixtral": "MixtralForCausalLM", "Qwen2-MoE": "Qwen2MoeForCausalLM"}


def info(name):
    return load_json(os.path.join(GEN_DIR, name, "case.json"))


SERVED = [n for n in CASES if not info(n)["refused"]]
REFUSED = [n for n in CASES if info(n)["refused"]]


def views(name):
    c = info(name)
    return ["model.safetensors"] + (["fp32/model.safetensors", "fp32/pytorch_model.bin"] if c["masters"] else []) + \
        (["hf/model.safetensors", "hf/config.json"] if c["family"] in HF_ARCHITECTURES else [])


def sources(name):
    save, tag = os.path.join(GEN_DIR, name, "checkpoint"), info(name)["tag"]
    return [("save dir", save, None), (f"save dir --tag {tag}", save, tag),
            ("iteration dir", os.path.join(save, tag), None)]


def check_fp32(d, name, model, what):
    """fp32/ holds exactly the masters Megatron reads back from the save (bit for bit), in both files."""
    want = torch.load(os.path.join(GEN_DIR, name, "expected", "fp32.pt"), map_location="cpu")
    st = H.read_safetensors(os.path.join(d, "fp32", "model.safetensors"))
    H.assert_state_equal(st, want, ordered=False, what=f"{what} fp32/model.safetensors vs expected/fp32.pt")
    b = torch.load(os.path.join(d, "fp32", "pytorch_model.bin"), map_location="cpu", weights_only=True)
    H.assert_state_equal(b, want, ordered=False, what=f"{what} fp32/pytorch_model.bin vs expected/fp32.pt")
    masters_round_to_model(st, model, f"{what} fp32")


def check_hf_present(d, name, what):
    arch = HF_ARCHITECTURES.get(info(name)["family"])
    if arch is None:
        return
    vocab = info(name)["vocab"]
    cfg = load_json(os.path.join(d, "hf", "config.json"))
    assert cfg["architectures"] == [arch], f"{what} hf/config.json architectures {cfg['architectures']}, want {arch}"
    assert cfg["vocab_size"] == vocab, f"{what} hf/config.json vocab_size {cfg['vocab_size']}, true vocabulary {vocab}"
    hf = H.read_safetensors(os.path.join(d, "hf", "model.safetensors"))
    assert hf["model.embed_tokens.weight"].shape[0] == vocab, f"{what} hf/ embedding not cut to the true vocabulary"


def check_views(name):
    def check(d, what):
        model = check_manifest_model(d, name, what, real_dir=GEN_DIR)
        assert not [k for k in model if "optimizer" in k or k.startswith("chained_")], f"{what}: optimizer state"
        if info(name)["masters"]:
            check_fp32(d, name, model, what)
        else:
            assert not os.path.exists(os.path.join(d, "fp32")), \
                f"{what}: fp32/ without masters to read back (no optimizer saved, or the chained distributed one)"
        check_hf_present(d, name, what)
    return check


def test_generated_fixtures_present():
    assert len(SERVED) >= 7 and REFUSED, f"mount_tests/fixtures/megatron-core-gen: cases {CASES}"
    for name in SERVED:
        for f in ("expected/manifest.json", "expected/full_model.pt", "expected/logits.json",
                  "checkpoint/latest_checkpointed_iteration.txt"):
            assert os.path.isfile(os.path.join(GEN_DIR, name, f)), f"missing {name}/{f}"


@pytest.mark.parametrize("name", SERVED)
def test_export_matches_megatron(export_cache, name):
    for label, src, tag in sources(name):
        proc, out = export_cache(src, tag)
        H.assert_ok(proc)
        check_views(name)(str(out), f"{name} export ({label})")


@pytest.mark.parametrize("name", SERVED)
def test_mount_matches_megatron(export_cache, ckptfs_bin, tmp_path, name):
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", os.path.join(GEN_DIR, name, "checkpoint"),
                info(name)["tag"], check_views(name), views(name), name)


@pytest.mark.parametrize("name", SERVED)
def test_inspect_shows_the_topology(ckptfs_bin, name):
    c = info(name)
    for label, src, tag in sources(name):
        if tag:
            continue
        proc = H.run([ckptfs_bin, "inspect", src, "--json"])
        H.assert_ok(proc)
        t = json.loads(proc.stdout)["tags"][0]
        topo = t["topology"]
        assert (topo["tp"], topo["pp"], topo["dp"], topo["ep"]) == (c["tp"], c["pp"], c["dp"], c["ep"]), \
            f"{name} ({label}): topology {topo}, Megatron ran TP {c['tp']} PP {c['pp']} DP {c['dp']} EP {c['ep']}"
        fmt = "Megatron-LM checkpoint (torch_dist)" if c["format"] == "torch_dist" else "Megatron-LM checkpoint"
        assert t["format"].startswith(fmt), f"{name} ({label}): {t['format']}"
        arch = HF_ARCHITECTURES.get(c["family"])
        hf_note = f"hf/: the model as Hugging Face's {arch}" if arch else "no hf/ view: "  # else the reason why not
        assert any(n.startswith(hf_note) for n in t["notes"]), f"{name} ({label}): no note {hf_note!r}: {t['notes']}"


@pytest.mark.parametrize("name", REFUSED)
def test_refused_with_the_reason(ckptfs_bin, tmp_path, name):
    """Megatron's legacy format with expert TP != TP: both expert-TP ranks of an EP rank write the same
    mp_rank_TT_EEE file, so half of every expert is lost; ckptfs says so (exit 4) instead of serving it."""
    for label, src, _ in sources(name):
        proc = H.run([ckptfs_bin, "inspect", src])
        assert proc.returncode == H.EXIT_INVALID, f"{name} ({label}): {H.describe(proc)}"
        assert info(name)["refused"] in proc.stderr, f"{name} ({label}): {proc.stderr}"
    proc = H.run([ckptfs_bin, "export", sources(name)[0][1], tmp_path / "out"])
    assert proc.returncode == H.EXIT_INVALID and info(name)["refused"] in proc.stderr, H.describe(proc)
