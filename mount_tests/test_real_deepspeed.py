"""ckptfs against checkpoints written by real DeepSpeed and the outputs of DeepSpeed's own tools, in two sets:
mount_tests/fixtures/deepspeed-real (DeepSpeed 0.14.5) and deepspeed-0.19-real (0.19.5: AutoTP, pipeline +
ZeRO-0 BF16_Optimizer, ZeRO-0 FP16_UnfusedOptimizer, ZeRO-3 with two param groups).

References: zero_to_fp32 (golden_fp32.*) or, where DeepSpeed's converters fail, DeepSpeed's own
load_checkpoint (golden_from_load.* says how); engine.save_16bit_model or, for AutoTP,
engine._consolidated_16bit_state_dict (model_16bit/); ds_to_universal (universal.manifest.json). Every view
is read twice: from `ckptfs export --universal` and through a mount of the save dir.

Known quirks of the references (ckptfs deliberately differs): zero_to_fp32 keeps frozen 16-bit params in
16 bits, casts integer buffers to fp32, drops frozen params under ZeRO-1, and refuses BF16_Optimizer and
pipeline checkpoints.  So golden tensors are compared with ``ours.to(golden dtype)``.
"""
import contextlib
import json
import os
import pickletools
import zipfile

import pytest
import torch

import helpers as H
import universal_loader as UL
from conftest import REAL_019_DIR, REAL_DIR
from mounting import mounted

SETS = {"deepspeed-real": REAL_DIR, "deepspeed-0.19-real": REAL_019_DIR}
REAL_CASES = [f"{s}/{d}" for s, root in SETS.items() if os.path.isdir(root)
              for d in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, d, "checkpoint"))]
VIAS = ("export", "mount")
TAG = "global_step3"
DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
         "bool": torch.bool}


def case_path(case, *parts):
    fixture_set, name = case.split("/")
    return os.path.join(SETS[fixture_set], name, *parts)


def manifest(case, *parts):
    p = case_path(case, *parts)
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        return json.load(f)


def cases_with(*parts):
    return [c for c in REAL_CASES if os.path.exists(case_path(c, *parts))]


def with_vias(cases):
    return [pytest.param(c, v, id=f"{c}-{v}") for c in cases for v in VIAS]


@pytest.fixture(scope="module")
def mount_cache(ckptfs_bin, tmp_path_factory):
    """mount(src) -> mount point; each save dir is mounted once per module, unmounted at its end."""
    mounts = {}
    with contextlib.ExitStack() as stack:
        def mount(src):
            if src not in mounts:
                mounts[src] = stack.enter_context(mounted(ckptfs_bin, src, tmp_path_factory.mktemp("mnt")))
            return mounts[src]
        yield mount


@pytest.fixture
def views(export_cache, mount_cache):
    """views(case, via, tag=None) -> the folder holding that tag's fp32/, model.safetensors and universal/
    (the latest tag when None), from `ckptfs export` or from a mount of the case's save dir."""
    def get(case, via, tag=None):
        src = case_path(case, "checkpoint")
        if via == "export":
            proc, out = export_cache(src, tag, universal=tag is None)
            H.assert_ok(proc)
            return str(out)
        mnt = mount_cache(src)
        return mnt if tag is None else os.path.join(mnt, "tags", tag)
    return get


def load_fp32(root):
    return torch.load(os.path.join(root, "fp32", "pytorch_model.bin"), map_location="cpu", weights_only=True)


def assert_matches_manifest(what, t, m):
    assert list(t.shape) == list(m["shape"]), f"{what}: shape {list(t.shape)}, reference {m['shape']}"
    assert H.sha256_le(t) == m["sha256"], f"{what}: bytes differ from the reference"


def assert_model_matches(what, model, ref):
    assert sorted(model) == sorted(ref), f"{what}: names differ: ours-only {sorted(set(model) - set(ref))}, " \
                                         f"reference-only {sorted(set(ref) - set(model))}"
    for k, m in ref.items():
        assert model[k].dtype == DTYPE[m["dtype"]], f"{what} {k}: dtype {model[k].dtype}, reference {m['dtype']}"
        assert_matches_manifest(f"{what} {k}", model[k], m)


def assert_trainable_match_universal(what, ours, uni):
    """Every param with a ds_to_universal fp32.pt: our fp32 tensor has its bytes (ZeRO-3 files are flat)."""
    checked = 0
    for pname, files in uni.items():
        if "fp32.pt" not in files:
            continue
        assert pname in ours, f"{what}: lacks {pname}"
        t = ours[pname]
        assert t.dtype == torch.float32, f"{what} {pname}: {t.dtype}"
        if len(files["fp32.pt"]["shape"]) == 1 and t.dim() != 1:
            t = t.reshape(-1)
        assert_matches_manifest(f"{what} {pname} vs universal fp32.pt", t, files["fp32.pt"])
        checked += 1
    assert checked > 0


def test_real_fixtures_present():
    expected = {"deepspeed-real/" + n for n in ("z1_fp32_ws4", "z2_bf16_ws2", "z3_fp16_ws2", "z0_bf16_ws2",
                                                 "pp2_z1_fp32_ws4")}
    expected |= {"deepspeed-0.19-real/" + n for n in ("z0_bf16_ws2", "pp2_bf16_ws2", "autotp2_z1_bf16_ws2",
                                                       "z3_bf16_pg2_ws2")}
    assert set(REAL_CASES) >= expected, f"real DeepSpeed fixtures missing: found {REAL_CASES}"


@pytest.mark.parametrize("case,via", with_vias(cases_with("golden_fp32.manifest.json")))
def test_fp32_matches_golden(views, case, via):
    """fp32/ against zero_to_fp32, or DeepSpeed's own load_checkpoint where its converters fail (0.19.5
    z0_bf16_ws2: FP16_UnfusedOptimizer masters; pp2_bf16_ws2: BF16_Optimizer masters of both stages)."""
    golden = manifest(case, "golden_fp32.manifest.json")
    root = views(case, via)
    ours = load_fp32(root)
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
    m16 = manifest(case, "model_16bit", "pytorch_model.manifest.json")
    for k in extra:
        assert m16 and k in m16, f"unexpected tensor {k} in ours"
        assert ours[k].dtype == torch.float32
        assert_matches_manifest(f"{k} (frozen, cast back)", ours[k].to(DTYPE[m16[k]["dtype"]]), m16[k])
    if case == "deepspeed-real/z1_fp32_ws4":
        assert extra == ["pos"], f"expected exactly the frozen 'pos' beyond golden, got {extra}"
    else:
        assert extra == [], f"ours has tensors the golden lacks: {extra}"
    # keys in zero_to_fp32's order (buffers, frozen, trainable, aliases), frozen extras in their place
    assert [k for k in ours if k in golden] == list(golden), "key order differs from zero_to_fp32"
    st = H.read_safetensors(os.path.join(root, "fp32", "model.safetensors"))
    H.assert_state_equal(st, ours, ordered=False, what=f"{case} fp32/model.safetensors vs pytorch_model.bin")


@pytest.mark.parametrize("case,via", with_vias(cases_with("model_16bit", "pytorch_model.manifest.json")))
def test_model_matches_16bit_reference(views, case, via):
    """model.safetensors against save_16bit_model (AutoTP: _consolidated_16bit_state_dict, full shapes;
    pipeline 0.19.5: both stages' loaded module state)."""
    ref = manifest(case, "model_16bit", "pytorch_model.manifest.json")
    assert_model_matches(case, H.read_safetensors(os.path.join(views(case, via), "model.safetensors")), ref)


@pytest.mark.parametrize("case,via", with_vias(cases_with("universal.manifest.json")))
def test_fp32_matches_universal_checkpoint(views, case, via):
    """ds_to_universal's zero/<param>/fp32.pt holds each trainable param's merged fp32 master. Covers
    BF16_Optimizer, pipeline and AutoTP checkpoints, which zero_to_fp32 refuses."""
    root = views(case, via)
    ours = load_fp32(root)
    assert_trainable_match_universal(case, ours, manifest(case, "universal.manifest.json"))
    H.assert_state_equal(H.read_safetensors(os.path.join(root, "fp32", "model.safetensors")), ours,
                         ordered=False, what=f"{case} fp32/model.safetensors vs pytorch_model.bin")


def universal_entry(path):
    """(container, dtype, shape, sha256, extra) of a universal file, as the manifests describe one."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict):
        t = obj["param"]
        return "dict", t, {k: v for k, v in obj.items() if k != "param"}
    return "Tensor", obj, {}


@pytest.mark.parametrize("case,via", with_vias(cases_with("universal.manifest.json")))
def test_universal_matches_ds_to_universal(views, case, via):
    """universal/ holds the files ds_to_universal writes, each with its container, extra keys (AutoTP:
    replicated params without cat_dim, row-parallel cat_dim 1, lm_head vocab_tensor), dtype, shape, bytes;
    the model-state copies are the tag's files byte for byte."""
    uni = manifest(case, "universal.manifest.json")
    root = os.path.join(views(case, via), "universal", f"{TAG}_universal")
    zero = os.path.join(root, "zero")
    params = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))
    assert params == sorted(uni), f"params differ: ours-only {set(params) - set(uni)}, ref-only {set(uni) - set(params)}"
    for pname, files in uni.items():
        assert sorted(os.listdir(os.path.join(zero, pname))) == sorted(files), f"{pname}: files differ"
        for fname, m in files.items():
            what = f"{case} universal {pname}/{fname}"
            container, t, extra = universal_entry(os.path.join(zero, pname, fname))
            assert container == m["container"], f"{what}: {container}, reference {m['container']}"
            assert extra == m["extra"], f"{what}: keys {extra}, reference {m['extra']}"
            assert str(t.dtype).removeprefix("torch.") == m["dtype"], f"{what}: dtype {t.dtype}"
            assert_matches_manifest(what, t, m)
    tag_dir = case_path(case, "checkpoint", TAG)
    for f in os.listdir(root):
        if f.endswith("model_states.pt"):
            with open(os.path.join(root, f), "rb") as a, open(os.path.join(tag_dir, f), "rb") as b:
                assert a.read() == b.read(), f"{case} universal {f}: not the tag's file"


@pytest.mark.parametrize("case,via", with_vias(cases_with("checkpoint", f"{TAG}_universal")))
def test_deepspeed_universal_tree_as_input(views, case, via):
    """DeepSpeed's own global_step3_universal/ beside the tag (AutoTP: full tensors in zero/, TP slices in
    the model-state copies) serves fp32/ = its fp32.pt values and model.safetensors = the 16-bit reference."""
    root = views(case, via, f"{TAG}_universal")
    ours = load_fp32(root)
    assert_trainable_match_universal(f"{case} universal tag", ours, manifest(case, "universal.manifest.json"))
    ref = manifest(case, "model_16bit", "pytorch_model.manifest.json")
    if ref is not None:
        assert_model_matches(f"{case} universal tag", H.read_safetensors(os.path.join(root, "model.safetensors")), ref)


@pytest.mark.parametrize("via", VIAS)
def test_pipeline_bf16_universal_rebuilds_the_shards(views, via):
    """0.19.5 pipeline + ZeRO-0 BF16_Optimizer: DeepSpeed's ds_to_universal fails (no param_shapes), ours
    writes a tree from which universal_loader (an independent re-implementation of DeepSpeed's universal
    load; the layout from the optimizer files' param_slice_mappings and the layer files) rebuilds every
    stage's fp32 / exp_avg / exp_avg_sq partitions bit for bit."""
    case = "deepspeed-0.19-real/pp2_bf16_ws2"
    tag_dir = case_path(case, "checkpoint", TAG)
    udir = os.path.join(views(case, via), "universal", f"{TAG}_universal")
    res = UL.check_against_shards(udir, tag_dir, UL.model_layout(tag_dir))
    assert res["elements_compared"] > 0 and res["params"] == 17, res
    assert list(UL.model_layout(udir).names().items()) == list(UL.model_layout(tag_dir).names().items())


@pytest.mark.parametrize("case", ["deepspeed-real/pp2_z1_fp32_ws4", "deepspeed-0.19-real/pp2_bf16_ws2"])
def test_pipeline_model_is_layer_files(export_cache, case):
    """Pipeline: model.safetensors = the layer files' tensors, named like PipelineModule names them."""
    expected = UL.layer_file_tensors(case_path(case, "checkpoint", TAG))
    proc, out = export_cache(case_path(case, "checkpoint"))
    H.assert_ok(proc)
    H.assert_state_equal(H.read_safetensors(out / "model.safetensors"), expected, ordered=False,
                         what=f"{case} model.safetensors")
    ours = load_fp32(out)
    # frozen pos and buffer mix come from layer_00, as fp32
    for k in ("tied_modules.embed.pos", "tied_modules.embed.mix"):
        H.assert_tensor_equal(k, ours[k], expected[k].float())


def pickle_ops(path):
    """The opcodes of a torch.save zip's data.pkl, and its member names."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        data = z.read(next(n for n in names if n.endswith("/data.pkl")))
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data)], names


# (case, topology ckptfs reports: ZeRO stage from the optimizer files' ZeroStageEnum where they have one)
V019_TOPOLOGY = {"z0_bf16_ws2": (0, 2, 1, 1), "pp2_bf16_ws2": (0, 1, 1, 2), "autotp2_z1_bf16_ws2": (1, 1, 2, 1),
                 "z3_bf16_pg2_ws2": (3, 2, 1, 1)}


@pytest.mark.parametrize("name", sorted(V019_TOPOLOGY))
def test_deepspeed_019_file_features(ckptfs_bin, name):
    """What the 0.19.5 files carry that 0.14.5's do not, and that ckptfs reads them: torch 2.14 zip records,
    ds_version 0.19.5 and checkpoint_parallel_dimensions in every model-state file, Python 3.14's
    ZeroStageEnum pickled by value (GLOBAL, the int, REDUCE), which gives the ZeRO stage ckptfs reports."""
    case = f"deepspeed-0.19-real/{name}"
    tag_dir = case_path(case, "checkpoint", TAG)
    for f in sorted(os.listdir(tag_dir)):
        ops, names = pickle_ops(os.path.join(tag_dir, f))
        for record in (".format_version", ".storage_alignment", "byteorder", ".data/serialization_id"):
            assert any(n.endswith("/" + record) for n in names), f"{f}: no {record} record"
        strings = [a for op, a in ops if op in ("SHORT_BINUNICODE", "BINUNICODE")]
        if "model_states" in f and not f.startswith("layer_"):
            assert "checkpoint_parallel_dimensions" in strings and "0.19.5" in strings, f
        enums = [i for i, (op, a) in enumerate(ops) if op == "GLOBAL" and a.endswith(" ZeroStageEnum")]
        for i in enums:
            assert [op for op, _ in ops[i + 1:i + 6] if op in ("TUPLE1", "REDUCE")] == ["TUPLE1", "REDUCE"], \
                f"{f}: ZeroStageEnum not pickled by value"
        if "optim_states" in f and name in ("autotp2_z1_bf16_ws2", "z3_bf16_pg2_ws2"):
            assert enums, f"{f}: no ZeroStageEnum"
    proc = H.run([ckptfs_bin, "inspect", case_path(case, "checkpoint"), "--json"])
    H.assert_ok(proc)
    topo = next(t for t in json.loads(proc.stdout)["tags"] if t["name"] == TAG)["topology"]
    assert (topo["zero_stage"], topo["dp"], topo["tp"], topo["pp"]) == V019_TOPOLOGY[name], topo


@pytest.mark.parametrize("case", REAL_CASES)
def test_inspect_real(ckptfs_bin, case):
    proc = H.run([ckptfs_bin, "inspect", case_path(case, "checkpoint"), "--json"])
    H.assert_ok(proc)
    json.loads(proc.stdout)
