"""ckptfs against checkpoints written by real Megatron-LM (mount_tests/fixtures/megatron-real, megatron-core
0.18.2: legacy_tp2_pp2 in the `torch` format, torch_dist_tp2_pp2 in the `torch_dist` format, the same job at
the same iteration) and what Megatron and Hugging Face make of them:

- model.safetensors: Megatron's own TP=1 PP=1 load (expected/manifest.json: names, shape, dtype, sha256;
  expected/full_model.pt: the tensors themselves);
- fp32/model.safetensors and fp32/pytorch_model.bin: the fp32 masters under the same names; each one rounded
  to bf16 (round to nearest even, torch's .to(torch.bfloat16)) is the bf16 model weight, since that is how
  Megatron makes the model weights from the masters after each optimizer step (checked on the raw files:
  all 321,440 elements of the legacy checkpoint's 4 ranks agree);
- hf/: legacy_tp2_pp2/expected/hf_llama (a Hugging Face LlamaForCausalLM export of the same weights) tensor
  for tensor, then byte for byte (model.safetensors), and its config's architecture fields; both checkpoints have the same weights, so the same
  reference serves both.

Each checkpoint is given to ckptfs as the save dir (`checkpoint/`, the mount root shows the tracker's
iteration, tags/iter_0000003/ the same) and as the iteration dir alone, through `ckptfs export` (and
`--tag iter_0000003`) and through a FUSE mount; `ckptfs inspect --json` says megatron, TP 2, PP 2.
mount_tests/modern/test_megatron_hf.py loads the mounted hf/ with transformers in a Debian unstable chroot.
"""
import filecmp
import json
import os
import subprocess

import pytest
import torch

import helpers as H
from mounting import CMD_TIMEOUT, mounted

REAL_DIR = os.path.join(H.HERE, "fixtures", "megatron-real")
CASES = ["legacy_tp2_pp2", "torch_dist_tp2_pp2"]
TAG = "iter_0000003"
HF_REF = os.path.join(REAL_DIR, "legacy_tp2_pp2", "expected", "hf_llama")
HF_CONFIG_FIELDS = ["architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "num_hidden_layers", "rms_norm_eps",
                    "max_position_embeddings", "vocab_size", "tie_word_embeddings"]
VIEWS = ["model.safetensors", "fp32/model.safetensors", "fp32/pytorch_model.bin", "hf/config.json",
         "hf/model.safetensors"]


def case_path(name, *parts):
    return os.path.join(REAL_DIR, name, *parts)


def load_json(path):
    with open(path) as f:
        return json.load(f)


def sources(name):
    """(label, source dir, tag for --tag or None) for each way of giving ckptfs this checkpoint."""
    save = case_path(name, "checkpoint")
    return [("save dir", save, None), (f"save dir --tag {TAG}", save, TAG),
            ("iteration dir", os.path.join(save, TAG), None)]


# ---------------------------------------------------------------------------------------------------
# the checks, on one directory holding the views (an export, the mount root, tags/<tag>/)

def check_model(d, name, what, real_dir=REAL_DIR):
    """model.safetensors against expected/manifest.json and expected/full_model.pt (of case `name` under
    `real_dir`); returns it."""
    manifest = load_json(os.path.join(real_dir, name, "expected", "manifest.json"))["tensors"]
    ours = H.read_safetensors(os.path.join(d, "model.safetensors"))
    assert set(ours) == set(manifest), f"{what} model.safetensors: names differ from Megatron's TP=1 PP=1 load: " \
        f"ours only {sorted(set(ours) - set(manifest))}, Megatron only {sorted(set(manifest) - set(ours))}"
    for k, m in manifest.items():
        t = ours[k]
        assert str(t.dtype) == f"torch.{m['dtype']}", f"{what} {k}: dtype {t.dtype}, Megatron {m['dtype']}"
        assert list(t.shape) == m["shape"], f"{what} {k}: shape {list(t.shape)}, Megatron {m['shape']}"
        assert H.sha256_le(t) == m["sha256"], f"{what} {k}: bytes differ from the manifest's sha256"
    full = H.load_expected(os.path.join(real_dir, name, "expected", "full_model.pt"))
    H.assert_state_equal(ours, full, ordered=False, what=f"{what} model.safetensors vs expected/full_model.pt")
    return ours


def masters_round_to_model(fp32, model, what):
    """Every fp32 master rounded to bf16 is the model tensor, bit for bit; the message counts the elements
    that are not, per tensor (measured, not hidden behind a tolerance)."""
    bad = []
    for k, m in model.items():
        r = fp32[k].to(m.dtype)
        iv = {2: torch.int16, 4: torch.int32, 8: torch.int64}[m.element_size()]
        diff = r.view(iv) != m.view(iv)
        n = int(diff.sum())
        if n:
            gap = (fp32[k] - m.float()).abs().max().item()
            bad.append(f"{k}: {n} of {m.numel()} elements (max |master - model| {gap:.3g}; "
                       f"{H.first_diff(r, m)})")
    assert not bad, f"{what}: fp32 masters rounded to {next(iter(model.values())).dtype} differ from the model " \
                    f"weights in {len(bad)} of {len(model)} tensors:\n  " + "\n  ".join(bad)
    # ... and they are the masters, not the model weights cast up: in these files 321,428 of the 321,440
    # master elements carry bits below bf16's precision
    upcast = [k for k, m in model.items() if int((fp32[k] != m.float()).sum()) * 2 < m.numel()]
    assert not upcast, f"{what}: fp32 tensors that are (mostly) the bf16 model weights cast up, not the " \
                       f"optimizer's fp32 masters: {upcast}"


def check_fp32(d, model, what):
    st = H.read_safetensors(os.path.join(d, "fp32", "model.safetensors"))
    b = torch.load(os.path.join(d, "fp32", "pytorch_model.bin"), map_location="cpu", weights_only=True)
    assert set(st) == set(model), f"{what} fp32/model.safetensors: names differ from model.safetensors: " \
        f"fp32 only {sorted(set(st) - set(model))}, model only {sorted(set(model) - set(st))}"
    for k, t in st.items():
        assert t.dtype == torch.float32, f"{what} fp32/model.safetensors {k}: {t.dtype}"
        assert t.shape == model[k].shape, f"{what} fp32 {k}: shape {tuple(t.shape)}, model {tuple(model[k].shape)}"
    H.assert_state_equal(b, st, ordered=False, what=f"{what} fp32/pytorch_model.bin vs fp32/model.safetensors")
    masters_round_to_model(st, model, f"{what} fp32")


def check_hf_config(cfg, ref, what):
    for f in HF_CONFIG_FIELDS:
        assert f in cfg, f"{what} hf/config.json has no {f}"
        assert cfg[f] == ref[f], f"{what} hf/config.json {f}: {cfg[f]!r}, reference {ref[f]!r}"
    theta = ref["rope_parameters"]["rope_theta"]
    assert cfg.get("rope_theta") == theta, f"{what} hf/config.json rope_theta {cfg.get('rope_theta')!r}, want {theta}"
    assert cfg.get("rope_parameters") == ref["rope_parameters"], \
        f"{what} hf/config.json rope_parameters {cfg.get('rope_parameters')!r}, reference {ref['rope_parameters']!r}"
    for f in ("dtype", "torch_dtype"):
        assert cfg.get(f) == ref["dtype"], f"{what} hf/config.json {f} {cfg.get(f)!r}, reference {ref['dtype']!r}"


def check_hf(d, what):
    ours = H.read_safetensors(os.path.join(d, "hf", "model.safetensors"))
    ref = H.read_safetensors(os.path.join(HF_REF, "model.safetensors"))
    H.assert_state_equal(ours, ref, ordered=False, what=f"{what} hf/model.safetensors vs expected/hf_llama")
    # The same tensors in safetensors' own writer order and header: the very file save_pretrained wrote.
    assert filecmp.cmp(os.path.join(d, "hf", "model.safetensors"), os.path.join(HF_REF, "model.safetensors"),
                       shallow=False), f"{what} hf/model.safetensors is not byte-identical to expected/hf_llama's"
    check_hf_config(load_json(os.path.join(d, "hf", "config.json")), load_json(os.path.join(HF_REF, "config.json")),
                    what)
    # no tokenizer or generation config in these save dirs: nothing to pass through
    assert sorted(os.listdir(os.path.join(d, "hf"))) == ["config.json", "model.safetensors"], \
        f"{what} hf/ holds {sorted(os.listdir(os.path.join(d, 'hf')))}"


def check_views(d, name, what):
    model = check_model(d, name, what)
    check_fp32(d, model, what)
    check_hf(d, what)


def same_files(a, b, rels, what):
    for rel in rels:
        r = subprocess.run(["cmp", os.path.join(a, rel), os.path.join(b, rel)], capture_output=True, text=True,
                           timeout=CMD_TIMEOUT)
        assert r.returncode == 0, f"{what} {rel}: {r.stdout}{r.stderr}"


# ---------------------------------------------------------------------------------------------------
# tests

def test_real_fixtures_present():
    for name in CASES:
        for f in ("checkpoint/latest_checkpointed_iteration.txt", "expected/manifest.json",
                  "expected/full_model.pt"):
            assert os.path.isfile(case_path(name, f)), f"missing real Megatron fixture file {name}/{f}"
    assert os.path.isfile(os.path.join(HF_REF, "model.safetensors"))


@pytest.mark.parametrize("name", CASES)
def test_export_matches_megatron(export_cache, name):
    for label, src, tag in sources(name):
        proc, out = export_cache(src, tag)
        H.assert_ok(proc)
        got = {os.path.relpath(os.path.join(dp, f), out) for dp, _, fs in os.walk(out) for f in fs}
        assert set(VIEWS) <= got, f"{name} export ({label}) lacks {sorted(set(VIEWS) - got)}; wrote {sorted(got)}"
        check_views(str(out), name, f"{name} export ({label})")


def check_mount(export_cache, ckptfs_bin, mnt, src, tag, check, views, what):
    """Mounts save dir `src` (one iteration, `tag`): check(dir, what) on the root and tags/<tag>/, and the
    `views` byte for byte as the export wrote them."""
    proc, out = export_cache(src)
    H.assert_ok(proc)
    with mounted(ckptfs_bin, src, mnt) as m:
        assert os.listdir(os.path.join(m, "tags")) == [tag]
        info = load_json(os.path.join(m, "ckptfs.json"))
        assert (info["framework"], info["root_tag"]) == ("megatron", tag), info
        for rel in (".", os.path.join("tags", tag)):
            d = os.path.join(m, rel)
            check(d, f"{what} mount {rel}")
            same_files(d, str(out), views, f"{what} mount {rel} vs export")


@pytest.mark.parametrize("name", CASES)
def test_mount_matches_megatron(export_cache, ckptfs_bin, tmp_path, name):
    check_mount(export_cache, ckptfs_bin, tmp_path / "mnt", case_path(name, "checkpoint"), TAG,
                lambda d, what: check_views(d, name, what), VIEWS, name)


def test_both_formats_give_the_same_hf_weights(export_cache):
    """The torch_dist checkpoint holds the legacy one's weights: their hf/ exports agree tensor for tensor."""
    hf = {}
    for name in CASES:
        proc, out = export_cache(case_path(name, "checkpoint"))
        H.assert_ok(proc)
        hf[name] = H.read_safetensors(os.path.join(out, "hf", "model.safetensors"))
    H.assert_state_equal(hf["torch_dist_tp2_pp2"], hf["legacy_tp2_pp2"], ordered=False,
                         what="hf/model.safetensors torch_dist vs legacy")


@pytest.mark.parametrize("name", CASES)
def test_inspect_says_megatron_tp2_pp2(ckptfs_bin, name):
    for label, src, _ in sources(name):
        if "--tag" in label:
            continue
        proc = H.run([ckptfs_bin, "inspect", src, "--json"])
        H.assert_ok(proc)
        info = json.loads(proc.stdout)
        assert info["framework"] == "megatron", f"{name} ({label}): framework {info['framework']!r}"
        assert [t["name"] for t in info["tags"]] == [TAG], f"{name} ({label}): tags {info['tags']}"
        topo = info["tags"][0]["topology"]
        assert (topo["tp"], topo["pp"]) == (2, 2), f"{name} ({label}): topology {topo}"
        assert topo["train_dtype"] in ("bfloat16", "torch.bfloat16"), f"{name} ({label}): topology {topo}"
