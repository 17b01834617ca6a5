"""ckptfs against checkpoints written by real DeepSpeed (mount_tests/fixtures/deepspeed-real, DeepSpeed
0.14.5) and the outputs of DeepSpeed's own tools: zero_to_fp32 (golden_fp32.*), engine.save_16bit_model
(model_16bit/) and ds_to_universal (universal.manifest.json).

Known quirks of the references (ckptfs deliberately differs): zero_to_fp32 keeps frozen 16-bit params in
16 bits, casts integer buffers to fp32, drops frozen params under ZeRO-1, and refuses BF16_Optimizer and
pipeline checkpoints.  So golden tensors are compared with ``ours.to(golden dtype)``.
"""
import json
import os

import pytest
import torch

import helpers as H
from conftest import REAL_DIR

REAL_CASES = sorted(d for d in os.listdir(REAL_DIR) if os.path.isdir(os.path.join(REAL_DIR, d, "checkpoint"))) \
    if os.path.isdir(REAL_DIR) else []
DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
         "bool": torch.bool}


def case_path(name, *parts):
    return os.path.join(REAL_DIR, name, *parts)


def manifest(name, *parts):
    p = case_path(name, *parts)
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        return json.load(f)


def ours_fp32(export_cache, name):
    proc, out = export_cache(case_path(name, "checkpoint"))
    H.assert_ok(proc)
    return torch.load(out / "fp32" / "pytorch_model.bin", map_location="cpu", weights_only=True), out


def assert_matches_manifest(what, t, m):
    assert list(t.shape) == list(m["shape"]), f"{what}: shape {list(t.shape)}, reference {m['shape']}"
    assert H.sha256_le(t) == m["sha256"], f"{what}: bytes differ from the reference"


def test_real_fixtures_present():
    assert set(REAL_CASES) >= {"z1_fp32_ws4", "z2_bf16_ws2", "z3_fp16_ws2", "z0_bf16_ws2", "pp2_z1_fp32_ws4"}, \
        f"real DeepSpeed fixtures missing under {REAL_DIR}: found {REAL_CASES}"


@pytest.mark.parametrize("name", [c for c in REAL_CASES if manifest(c, "golden_fp32.manifest.json")])
def test_fp32_matches_zero_to_fp32(export_cache, name):
    golden = manifest(name, "golden_fp32.manifest.json")
    ours, out = ours_fp32(export_cache, name)
    missing = [k for k in golden if k not in ours]
    assert not missing, f"ours lacks {missing}"
    for k, m in golden.items():
        t = ours[k]
        if t.is_floating_point():
            assert t.dtype == torch.float32, f"{k}: ours is {t.dtype}; ckptfs serves float params/buffers as float32"
        assert_matches_manifest(k, t.to(DTYPE[m["dtype"]]), m)
    # where golden lacks something, it is a frozen parameter zero_to_fp32 dropped (ZeRO-1): ours has it, as
    # the fp32 upcast of what module holds
    extra = [k for k in ours if k not in golden]
    m16 = manifest(name, "model_16bit", "pytorch_model.manifest.json")
    for k in extra:
        assert m16 and k in m16, f"unexpected tensor {k} in ours"
        assert ours[k].dtype == torch.float32
        assert_matches_manifest(f"{k} (frozen, cast back)", ours[k].to(DTYPE[m16[k]["dtype"]]), m16[k])
    if name == "z1_fp32_ws4":
        assert extra == ["pos"], f"expected exactly the frozen 'pos' beyond golden, got {extra}"
    # keys in zero_to_fp32's order (buffers, frozen, trainable, aliases), frozen extras in their place
    assert [k for k in ours if k in golden] == list(golden), "key order differs from zero_to_fp32"
    # the safetensors twin holds the same tensors
    st = H.read_safetensors(out / "fp32" / "model.safetensors")
    H.assert_state_equal(st, ours, ordered=False, what=f"{name} fp32/model.safetensors vs pytorch_model.bin")


@pytest.mark.parametrize("name", [c for c in REAL_CASES if manifest(c, "model_16bit", "pytorch_model.manifest.json")])
def test_model_matches_save_16bit_model(export_cache, name):
    ref = manifest(name, "model_16bit", "pytorch_model.manifest.json")
    proc, out = export_cache(case_path(name, "checkpoint"))
    H.assert_ok(proc)
    ours = H.read_safetensors(out / "model.safetensors")
    assert sorted(ours) == sorted(ref), f"names differ: ours-only {sorted(set(ours) - set(ref))}, " \
                                        f"reference-only {sorted(set(ref) - set(ours))}"
    for k, m in ref.items():
        assert ours[k].dtype == DTYPE[m["dtype"]], f"{k}: dtype {ours[k].dtype}, reference {m['dtype']}"
        assert_matches_manifest(k, ours[k], m)


@pytest.mark.parametrize("name", [c for c in REAL_CASES if manifest(c, "universal.manifest.json")])
def test_fp32_matches_universal_checkpoint(export_cache, name):
    """ds_to_universal's zero/<param>/fp32.pt holds each trainable param's merged fp32 master (manifest
    keyed by param name).  Covers BF16_Optimizer and pipeline checkpoints, which zero_to_fp32 refuses."""
    uni = manifest(name, "universal.manifest.json")
    ours, _ = ours_fp32(export_cache, name)
    checked = 0
    for pname, files in uni.items():
        if "fp32.pt" not in files:
            continue
        assert pname in ours, f"ours lacks {pname}"
        assert ours[pname].dtype == torch.float32
        t = ours[pname]
        if len(files["fp32.pt"]["shape"]) == 1 and t.dim() != 1:
            t = t.reshape(-1)  # ZeRO-3 universal fp32.pt files are bare flat tensors
        assert_matches_manifest(f"{pname} vs universal fp32.pt", t, files["fp32.pt"])
        checked += 1
    assert checked > 0


def test_pipeline_model_is_layer_files(export_cache):
    """Pipeline: model.safetensors = the layer files' tensors, named like PipelineModule names them."""
    name = "pp2_z1_fp32_ws4"
    if name not in REAL_CASES:
        pytest.fail(f"missing real fixture {name}")
    tag = os.path.join(case_path(name, "checkpoint"), "global_step3")
    expected = {}
    for f in sorted(os.listdir(tag)):
        if f.startswith("layer_") and f.endswith("-model_states.pt"):
            li = int(f[len("layer_"):].split("-")[0])
            sd = torch.load(os.path.join(tag, f), map_location="cpu", weights_only=True)
            prefix = "tied_modules.embed." if li == 0 else f"{li}."
            for k, v in sd.items():
                expected[prefix + k] = v
    proc, out = export_cache(case_path(name, "checkpoint"))
    H.assert_ok(proc)
    H.assert_state_equal(H.read_safetensors(out / "model.safetensors"), expected, ordered=False,
                         what=f"{name} model.safetensors")
    ours, _ = ours_fp32(export_cache, name)
    # frozen pos and buffer mix come from layer_00, as fp32
    for k in ("tied_modules.embed.pos", "tied_modules.embed.mix"):
        H.assert_tensor_equal(k, ours[k], expected[k].float())


@pytest.mark.parametrize("name", REAL_CASES)
def test_inspect_real(ckptfs_bin, name):
    proc = H.run([ckptfs_bin, "inspect", case_path(name, "checkpoint"), "--json"])
    H.assert_ok(proc)
    json.loads(proc.stdout)
