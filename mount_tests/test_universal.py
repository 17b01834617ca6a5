"""The virtual DeepSpeed universal checkpoint (``universal/``, what ds_to_universal.py writes; spec:
docs/formats/universal.md) and universal trees as ckptfs input.

- generated cases: the exact tree at the mount root and under tags/<tag>/, every file against the
  generator's expectations (expected*/universal.pt, universal_optimizer_state.pt, case.json "universal");
- the real DeepSpeed fixtures: our tree equals DeepSpeed's own ``global_step3_universal/`` file by file;
- round trip: universal_loader.py (an independent re-implementation of DeepSpeed's universal *load*)
  rebuilds every rank's partitions from our tree, for N' = W (equal to the shards) and other DP sizes;
- ``ckptfs export`` reads no Adam-moment byte (strace);
- a universal tree as input (DeepSpeed's, and a copy of ours) serves the same fp32/model views;
- many_params_z2_dp2: 81,922 files listed, sized and sampled.

Tests that need no ckptfs (the loader against DeepSpeed's output, the generator's expectations against
its shards) run first and hold on their own.
"""
import enum
import filecmp
import io
import json
import math
import os
import pickle
import re
import shutil
import struct
import sys
import zipfile

import pytest
import torch

import helpers as H
import universal_loader as UL
from conftest import GENERATOR, GEN_TIMEOUT, REAL_019_DIR, REAL_DIR, case_info
from mounting import CMD_TIMEOUT, mounted

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))
import generate  # noqa: E402

ALL_CASES = generate.make_cases()
UNI_CASES = [c["name"] for c in ALL_CASES if generate.has_universal(c)]
NO_UNI_CASES = [c["name"] for c in ALL_CASES if not generate.has_universal(c)]
# universal tree as input: a pipeline tree carries no layer files, so its frozen params and buffers (which
# live only there) cannot be served: the expectation is the trainable part of the original tag's views
PIPELINE_CASES = [c["name"] for c in ALL_CASES if c["pipeline"]]
# real fixtures with DeepSpeed's own universal tree: DeepSpeed 0.14.5's, and 0.19.5's ZeRO-3 with two param
# groups (the 0.19.5 AutoTP tree: test_real_deepspeed.py, universal_loader does not model TP)
REAL_SETS = {**{n: REAL_DIR for n in ("z1_fp32_ws4", "z2_bf16_ws2", "z3_fp16_ws2", "z0_bf16_ws2", "pp2_z1_fp32_ws4")},
             "z3_bf16_pg2_ws2": REAL_019_DIR}
REAL_CASES = list(REAL_SETS)
# 0.19.5 AutoTP (TP 2): its tree is compared file by file only
TP_REAL_SETS = {"autotp2_z1_bf16_ws2": REAL_019_DIR}
REAL_TAG = "global_step3"
MANY = "many_params_z2_dp2"
KEYS = ("fp32", "exp_avg", "exp_avg_sq")
SLOW_TIMEOUT = 300


def real_path(name, *parts):
    return os.path.join({**REAL_SETS, **TP_REAL_SETS}[name], name, "checkpoint", *parts)


def no_universal_dir(mnt, where="universal"):
    return f"no {where}/ dir in the mount ({sorted(os.listdir(mnt))}): ckptfs does not serve universal/ yet?"


# ----------------------------------------------------------------------------------------------------
# comparison of loaded objects

def storage_meta(t):
    return t.storage_offset(), t.storage().size()


def assert_same(ours, ref, what, storage=False):
    """Same structure, types, dict key order, values; tensors: dtype, shape, stride, requires_grad, bytes
    (and with ``storage``: storage offset and size)."""
    if torch.is_tensor(ref):
        assert torch.is_tensor(ours), f"{what}: {type(ours).__name__}, expected a tensor"
        assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype}, expected {ref.dtype}"
        assert tuple(ours.shape) == tuple(ref.shape), f"{what}: shape {tuple(ours.shape)}, expected {tuple(ref.shape)}"
        assert ours.stride() == ref.stride(), f"{what}: stride {ours.stride()}, expected {ref.stride()}"
        assert ours.requires_grad == ref.requires_grad, \
            f"{what}: requires_grad {ours.requires_grad}, expected {ref.requires_grad}"
        if storage:
            assert storage_meta(ours) == storage_meta(ref), \
                f"{what}: storage (offset, size) {storage_meta(ours)}, expected {storage_meta(ref)}"
        if H.tensor_bytes(ours) != H.tensor_bytes(ref):
            raise AssertionError(f"{what}: bytes differ ({H.first_diff(ours, ref)})")
    elif isinstance(ref, dict):
        assert type(ours) is type(ref), f"{what}: {type(ours).__name__}, expected {type(ref).__name__}"
        assert list(ours) == list(ref), f"{what}: keys {list(ours)}, expected {list(ref)}"
        for k in ref:
            assert_same(ours[k], ref[k], f"{what}[{k!r}]", storage)
    elif isinstance(ref, (list, tuple)):
        assert type(ours) is type(ref), f"{what}: {type(ours).__name__}, expected {type(ref).__name__}"
        assert len(ours) == len(ref), f"{what}: {len(ours)} items, expected {len(ref)}"
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_same(a, b, f"{what}[{i}]", storage)
    elif isinstance(ref, enum.Enum):
        assert type(ours) is type(ref) and ours == ref, f"{what}: {ours!r}, expected {ref!r}"
    elif isinstance(ref, float):
        assert type(ours) is float and struct.pack("<d", ours) == struct.pack("<d", ref), \
            f"{what}: {ours!r}, expected {ref!r}"
    elif hasattr(ref, "__dict__") and not isinstance(ref, type):
        assert (type(ours).__module__, type(ours).__qualname__) == (type(ref).__module__, type(ref).__qualname__), \
            f"{what}: {type(ours)}, expected {type(ref)}"
        assert sorted(vars(ours)) == sorted(vars(ref)), f"{what}: attributes {sorted(vars(ours))}, expected " \
                                                        f"{sorted(vars(ref))}"
        for k in vars(ref):
            assert_same(vars(ours)[k], vars(ref)[k], f"{what}.{k}", storage)
    else:
        assert type(ours) is type(ref) and ours == ref, f"{what}: {ours!r}, expected {ref!r}"


def zip_names(path):
    with zipfile.ZipFile(path) as z:  # reads the central directory only (CRCs are not checked)
        return z.namelist()


def check_zip_names(path, stem, tensors=None):
    """Top folder = the file stem, data.pkl first, a version record, ``tensors`` data/<i> records.  (DeepSpeed's
    torch 1.13 files have exactly data.pkl, data/0.., version; newer torch writers add .format_version,
    .storage_alignment, byteorder, which every torch.load accepts, so they are allowed.)"""
    names = zip_names(path)
    assert names and all(n.startswith(stem + "/") for n in names), f"{path}: zip records {names}, top folder " \
                                                                    f"should be {stem}/"
    assert names[0] == f"{stem}/data.pkl" and f"{stem}/version" in names, f"{path}: zip records {names}"
    if tensors is not None:
        data = [n for n in names if n.startswith(f"{stem}/data/")]
        assert data == [f"{stem}/data/{i}" for i in range(tensors)], f"{path}: zip records {names}"


def check_optimizer_state_zip(path):
    check_zip_names(path, "optimizer_state")


def load_pt(path, weights_only=True):
    return torch.load(path, map_location="cpu", weights_only=weights_only)


def walk(root):
    """(set of files, set of dirs), relative to root."""
    files, dirs = set(), set()
    for d, ds, fs in os.walk(root):
        rel = os.path.relpath(d, root)
        for x in ds:
            dirs.add(os.path.normpath(os.path.join(rel, x)))
        for x in fs:
            files.add(os.path.normpath(os.path.join(rel, x)))
    return files, dirs


def assert_set_equal(ours, exp, what):
    missing, extra = sorted(exp - ours), sorted(ours - exp)
    assert not missing and not extra, \
        f"{what}: {len(missing)} missing {missing[:10]}, {len(extra)} unexpected {extra[:10]}"


def read_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == os.stat(path).st_size, f"{path}: st_size {os.stat(path).st_size}, read {len(data)} bytes"
    return data


# ----------------------------------------------------------------------------------------------------
# expectations of a generated case

class Expect:
    def __init__(self, fixtures_dir, name, tag):
        self.info = case_info(fixtures_dir, name)
        u = self.info["universal"]
        assert u, f"{name}: case.json has no universal expectation"
        self.form, self.step, self.copies, self.nfiles = u["form"], u["step"], u["copies"], u["files"]
        d = os.path.join(fixtures_dir, name, self.info["expected"][tag])
        self.params = load_pt(os.path.join(d, u["expected"]))
        self.optimizer_state = load_pt(os.path.join(d, u["optimizer_state"]), weights_only=False)
        save = os.path.join(fixtures_dir, name, "checkpoint")
        self.tag_dir = os.path.join(save, tag)
        self.tag = tag

    def file_set(self):
        t = f"{self.tag}_universal"
        keys = KEYS + (("step",) if self.step else ())
        files = {"latest_universal", f"{t}/zero/optimizer_state.pt"} | {f"{t}/{c}" for c in self.copies}
        files |= {f"{t}/zero/{n}/{k}.pt" for n in self.params for k in keys}
        dirs = {t, f"{t}/zero"} | {f"{t}/zero/{n}" for n in self.params}
        return files, dirs

    def param_object(self, name, key):
        """The object zero/<name>/<key>.pt must unpickle to (§2)."""
        v = self.params[name][key]
        if key == "step":
            return v.clone()
        t = v.clone().contiguous()
        if self.form == "bare":
            t = t.reshape(-1)
        if key == "fp32":
            t.requires_grad_(True)
        return t if self.form == "bare" else {"cat_dim": 0, "param": t}


def check_param_file(path, expected_obj, key):
    ours = load_pt(path)
    assert_same(ours, expected_obj, path, storage=True)
    check_zip_names(path, key, 1)
    t = ours["param"] if isinstance(ours, dict) else ours
    assert t.is_contiguous() and t.storage_offset() == 0 and t.storage().size() == t.numel(), \
        f"{path}: not a compact tensor (storage {storage_meta(t)}, numel {t.numel()})"


def check_generated_tree(root, exp, params=None):
    """root = a mounted universal/ dir; every file (or, with ``params``, the files of those params) against
    the expectation."""
    t = f"{exp.tag}_universal"
    assert read_bytes(os.path.join(root, "latest_universal")) == t.encode(), "latest_universal content"
    for c in exp.copies:
        assert filecmp.cmp(os.path.join(root, t, c), os.path.join(exp.tag_dir, c), shallow=False), \
            f"{t}/{c} differs from the tag's {c}"
    ours_osd = load_pt(os.path.join(root, t, "zero", "optimizer_state.pt"), weights_only=False)
    assert_same(ours_osd, exp.optimizer_state, f"{t}/zero/optimizer_state.pt")
    check_optimizer_state_zip(os.path.join(root, t, "zero", "optimizer_state.pt"))
    keys = KEYS + (("step",) if exp.step else ())
    for n in (exp.params if params is None else params):
        for k in keys:
            check_param_file(os.path.join(root, t, "zero", n, f"{k}.pt"), exp.param_object(n, k), k)


def locations(info):
    """(universal dir in the mount, tag) pairs: the root (latest tag) and every tags/<tag>/."""
    return [("universal", info["latest"])] + [(os.path.join("tags", t, "universal"), t) for t in info["tags"]]


# ----------------------------------------------------------------------------------------------------
# without ckptfs: the loader against DeepSpeed's own output, the generator against its shards

@pytest.mark.parametrize("name", REAL_CASES)
def test_loader_rebuilds_real_shards_from_deepspeed_universal(name):
    """universal_loader, fed with DeepSpeed's own tree, reproduces every original rank partition (N' = W)
    and covers every element exactly once for other DP sizes."""
    tag_dir, udir = real_path(name, REAL_TAG), real_path(name, f"{REAL_TAG}_universal")
    layout = UL.model_layout(tag_dir)
    res = UL.check_against_shards(udir, tag_dir, layout)
    assert res["elements_compared"] + res["replica_elements"] > 0
    W = res["W"]
    UL.check_resharding(udir, layout, sorted({1, 3, 2 * W}))


def test_loader_rejects_a_wrong_tree():
    """The loader check is not vacuous: one moment element or two swapped fp32 params are caught."""
    name = "z1_fp32_ws4"
    tag_dir, udir = real_path(name, REAL_TAG), real_path(name, f"{REAL_TAG}_universal")
    layout = UL.model_layout(tag_dir)
    src = UL.DirSource(udir, "dict")
    params = {n: {f[:-3]: (src.get(n, f) if f == "step.pt" else load_pt(os.path.join(udir, "zero", n, f))["param"])
                  for _, f in src.keys_of(n)} for n in layout.names()}
    osd = src.osd()
    bad = {n: dict(v) for n, v in params.items()}
    bad["blocks.1.fc2.bias"]["exp_avg_sq"] = bad["blocks.1.fc2.bias"]["exp_avg_sq"].clone()
    bad["blocks.1.fc2.bias"]["exp_avg_sq"].view(-1)[5] += 1e-3
    with pytest.raises(AssertionError, match="exp_avg_sq"):
        UL.check_against_shards(UL.MemorySource(bad, osd, "dict"), tag_dir, layout)
    bad = {n: dict(v) for n, v in params.items()}
    bad["blocks.0.ln.weight"], bad["blocks.0.ln.bias"] = params["blocks.0.ln.bias"], params["blocks.0.ln.weight"]
    with pytest.raises(AssertionError, match="fp32"):
        UL.check_against_shards(UL.MemorySource(bad, osd, "dict"), tag_dir, layout)
    UL.check_against_shards(UL.MemorySource(params, osd, "dict"), tag_dir, layout)


@pytest.mark.parametrize("name", UNI_CASES)
def test_generator_universal_expectations(fixtures_dir, name):
    """expected*/universal.pt, fed to universal_loader, reproduces the generated shards (N' = W) and covers
    every element for other DP sizes; its fp32 values are the expected fp32.pt's trainable tensors."""
    info = case_info(fixtures_dir, name)
    for tag in info["tags"]:
        exp = Expect(fixtures_dir, name, tag)
        layout = UL.model_layout(exp.tag_dir)
        assert list(exp.params) == list(layout.names()), "universal.pt names are not the param_shapes names"
        assert exp.form == ("bare" if layout.stage == 3 else "dict")
        assert exp.nfiles == len(exp.file_set()[0]) - 1  # latest_universal sits outside the tag's dir
        assert sorted(exp.copies) == sorted(
            f for f in os.listdir(exp.tag_dir)
            if (f.endswith("model_states.pt") if layout.stage == 3 else f.startswith("mp")))
        src = UL.MemorySource(exp.params, exp.optimizer_state, exp.form)
        res = UL.check_against_shards(src, exp.tag_dir, layout)
        UL.check_resharding(src, layout, sorted({1, 3, 2 * res["W"]}))
        fp32 = H.load_expected(os.path.join(fixtures_dir, name, info["expected"][tag], "fp32.pt"))
        for n, shape in layout.names().items():
            t = exp.params[n]["fp32"]
            assert tuple(t.shape) == (tuple(shape) if exp.form == "dict" else (math.prod(shape),)), n
            H.assert_tensor_equal(f"{tag} {n}", t.reshape(shape), fp32[n])
            if exp.step:
                assert exp.params[n]["step"].shape == () and exp.params[n]["step"].dtype == torch.float32


# ----------------------------------------------------------------------------------------------------
# (a) generated cases: the exact tree, every file

@pytest.fixture(scope="module", params=UNI_CASES)
def uni_mount(request, fixtures_dir, ckptfs_bin, tmp_path_factory):
    """(case info, mount point) for one case with partitioned optimizer state."""
    name = request.param
    info = case_info(fixtures_dir, name)
    src = os.path.join(fixtures_dir, name, info["src"])
    with mounted(ckptfs_bin, src, tmp_path_factory.mktemp(f"uni-{name}")) as mnt:
        yield info, mnt


def test_generated_tree(uni_mount, fixtures_dir):
    info, mnt = uni_mount
    assert os.path.isdir(os.path.join(mnt, "universal")), no_universal_dir(mnt)
    for where, tag in locations(info):
        assert os.path.isdir(os.path.join(mnt, where)), no_universal_dir(mnt, where)
        exp = Expect(fixtures_dir, info["name"], tag)
        files, dirs = walk(os.path.join(mnt, where))
        want_files, want_dirs = exp.file_set()
        assert_set_equal(files, want_files, f"{where} files")
        assert_set_equal(dirs, want_dirs, f"{where} dirs")
        check_generated_tree(os.path.join(mnt, where), exp)


@pytest.mark.parametrize("name", NO_UNI_CASES)
def test_no_universal_without_partitioned_state(fixtures_dir, ckptfs_bin, tmp_path, name):
    """ZeRO-0 with a torch optimizer or FP16_Optimizer: the optimizer state sits in the model file, no
    universal/ anywhere."""
    info = case_info(fixtures_dir, name)
    with mounted(ckptfs_bin, os.path.join(fixtures_dir, name, info["src"]), tmp_path / "mnt") as mnt:
        assert os.path.isfile(os.path.join(mnt, "fp32", "pytorch_model.bin"))
        for where, _ in locations(info):
            assert not os.path.exists(os.path.join(mnt, where)), f"{where} exists"


# ----------------------------------------------------------------------------------------------------
# (c) round trip through DeepSpeed's load logic

def test_generated_round_trip(uni_mount, fixtures_dir):
    info, mnt = uni_mount
    for where, tag in locations(info)[1:]:
        udir = os.path.join(mnt, where, f"{tag}_universal")
        assert os.path.isdir(udir), no_universal_dir(mnt, where)
        tag_dir = os.path.join(fixtures_dir, info["name"], "checkpoint", tag)
        layout = UL.model_layout(udir)  # from the copies in our tree
        res = UL.check_against_shards(udir, tag_dir, layout)
        assert res["W"] == info["dp"]
        UL.check_resharding(udir, layout, sorted({1, 3, 2 * info["dp"]} - {info["dp"]}))


# ----------------------------------------------------------------------------------------------------
# (b) real DeepSpeed fixtures: our tree == DeepSpeed's global_step3_universal/

@pytest.fixture(scope="module", params=[(n, v) for n in REAL_CASES for v in ("as_is", "without_ds_output")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def real_mount(request, ckptfs_bin, tmp_path_factory):
    """The real save dir checkpoint/ mounted as it is (DeepSpeed's global_step3_universal/ and
    latest_universal beside the training tag), or a copy without them."""
    name, variant = request.param
    src = real_path(name)
    if variant == "without_ds_output":
        dst = tmp_path_factory.mktemp(f"real-{name}") / "checkpoint"
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(f"{REAL_TAG}_universal", "latest_universal"))
        src = str(dst)
    with mounted(ckptfs_bin, src, tmp_path_factory.mktemp(f"mnt-{name}-{variant}")) as mnt:
        yield name, variant, mnt


def compare_with_deepspeed(ours_root, name):
    """ours_root = a mounted universal/ dir; reference = the fixture's DeepSpeed output."""
    ref_dir = real_path(name, f"{REAL_TAG}_universal")
    t = f"{REAL_TAG}_universal"
    files, dirs = walk(ours_root)
    ref_files, ref_dirs = walk(ref_dir)
    assert_set_equal(files, {"latest_universal"} | {f"{t}/{f}" for f in ref_files}, f"{ours_root} files")
    assert_set_equal(dirs, {t} | {f"{t}/{d}" for d in ref_dirs}, f"{ours_root} dirs")
    assert read_bytes(os.path.join(ours_root, "latest_universal")) == read_bytes(real_path(name, "latest_universal"))
    for rel in sorted(ref_files):
        ours, ref = os.path.join(ours_root, t, rel), os.path.join(ref_dir, rel)
        if rel.endswith("model_states.pt"):
            assert filecmp.cmp(ours, ref, shallow=False), f"{rel}: not byte-identical to DeepSpeed's copy"
            assert filecmp.cmp(ours, real_path(name, REAL_TAG, rel), shallow=False)
        elif rel == "zero/optimizer_state.pt":
            assert_same(load_pt(ours, False), load_pt(ref, False), rel)
            check_optimizer_state_zip(ours)
        else:
            read_bytes(ours)
            stem = os.path.basename(rel)[:-3]
            assert_same(load_pt(ours), load_pt(ref), rel, storage=True)
            check_zip_names(ours, stem, len([n for n in zip_names(ref) if "/data/" in n]))


def test_real_tree_equals_deepspeed(real_mount):
    name, variant, mnt = real_mount
    assert os.path.isdir(os.path.join(mnt, "universal")), no_universal_dir(mnt)
    # the root serves the tag `latest` names, whatever ckptfs makes of DeepSpeed's output beside it
    with open(os.path.join(mnt, "ckptfs.json")) as f:
        assert json.load(f)["root_tag"] == REAL_TAG
    assert REAL_TAG in os.listdir(os.path.join(mnt, "tags"))
    compare_with_deepspeed(os.path.join(mnt, "universal"), name)
    compare_with_deepspeed(os.path.join(mnt, "tags", REAL_TAG, "universal"), name)


@pytest.mark.parametrize("name", list(TP_REAL_SETS))
def test_real_tensor_parallel_tree_equals_deepspeed(ckptfs_bin, tmp_path, name):
    """AutoTP: our universal/ is DeepSpeed's global_step3_universal/ file by file (model-state copies of both
    TP ranks byte for byte, the same objects, storages and zip members), from the save dir as it is."""
    with mounted(ckptfs_bin, real_path(name), tmp_path / "mnt") as mnt:
        compare_with_deepspeed(os.path.join(mnt, "universal"), name)
        compare_with_deepspeed(os.path.join(mnt, "tags", REAL_TAG, "universal"), name)


def test_real_round_trip(real_mount):
    name, variant, mnt = real_mount
    udir = os.path.join(mnt, "universal", f"{REAL_TAG}_universal")
    assert os.path.isdir(udir), no_universal_dir(mnt)
    layout = UL.model_layout(udir)
    res = UL.check_against_shards(udir, real_path(name, REAL_TAG), layout)
    UL.check_resharding(udir, layout, sorted({1, 3, 2 * res["W"]} - {res["W"]}))


# ----------------------------------------------------------------------------------------------------
# (d) fp32/model reads touch no Adam moment

class _TRef:
    def __init__(self, storage, offset, size):
        self.storage, self.offset, self.numel = storage, offset, math.prod(size)


class _SRef:
    ITEM = {"FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "DoubleStorage": 8, "LongStorage": 8,
            "IntStorage": 4, "ByteStorage": 1, "BoolStorage": 1}

    def __init__(self, kind, key):
        self.item, self.key = self.ITEM[kind], key


class _Recorder(pickle.Unpickler):
    """Unpickles a torch.save data.pkl without torch: tensors become _TRef(storage key, offset, numel)."""

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, *rest: _TRef(storage, offset, size)
        if module == "torch" and name.endswith("Storage"):
            return name
        return super().find_class(module, name)

    def persistent_load(self, pid):
        assert pid[0] == "storage", pid
        return _SRef(pid[1], pid[2])


def zip_members(path):
    """member name -> (data offset in the file, size); read from the local headers (STORED records)."""
    out = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for i in z.infolist():
            f.seek(i.header_offset)
            h = f.read(30)
            assert h[:4] == b"PK\x03\x04"
            n, e = struct.unpack("<HH", h[26:30])
            out[i.filename] = (i.header_offset + 30 + n + e, i.file_size)
    return out


def storage_ranges(path):
    """{'moment': [(lo, hi)], 'fp32': [(lo, hi)]}: file byte ranges of the optimizer file's Adam moments and
    fp32 master partitions."""
    members = zip_members(path)
    (pkl,) = [m for m in members if m.endswith("/data.pkl")]
    prefix = pkl[: -len("data.pkl")]
    with open(path, "rb") as f:
        f.seek(members[pkl][0])
        root = _Recorder(io.BytesIO(f.read(members[pkl][1]))).load()
    osd = root["optimizer_state_dict"]
    if "fp32_flat_groups" in osd:
        state, fp32 = osd["optimizer_state_dict"]["state"], osd["fp32_flat_groups"]
    else:
        state, fp32 = osd["base_optimizer_state"]["state"], osd["single_partition_of_fp32_groups"]

    def rng(t):
        lo = members[f"{prefix}data/{t.storage.key}"][0] + t.offset * t.storage.item
        return lo, lo + t.numel * t.storage.item

    return {"moment": [rng(s[k]) for s in state.values() for k in ("exp_avg", "exp_avg_sq")],
            "fp32": [rng(t) for t in fp32]}


def strace_preads(log_prefix):
    """path -> [(offset, bytes read)] from `strace -ff -y` logs."""
    pat = re.compile(r"^pread64\(\d+<([^>]*)>, .*, (\d+), (\d+)\) = (\d+)")
    out = {}
    d, base = os.path.split(log_prefix)
    for f in os.listdir(d):
        if f.startswith(base + "."):
            with open(os.path.join(d, f)) as fh:
                for line in fh:
                    m = pat.match(line)
                    if m:
                        out.setdefault(m.group(1), []).append((int(m.group(3)), int(m.group(4))))
    return out


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


# moment storages must lie outside the last 64 KiB + 22 bytes of each optimizer file, which a zip reader may
# scan for the end-of-central-directory record: cases whose fp32 partitions fill that tail
STRACE_CASES = [("generated", "llama_z3_bf16_dp2"), ("generated", MANY)]
EOCD_SCAN = 65535 + 22


@pytest.fixture(scope="module")
def many_dir(fixtures_dir):
    proc = H.run([sys.executable, GENERATOR, fixtures_dir, "--only", MANY], timeout=GEN_TIMEOUT)
    assert proc.returncode == 0, H.describe(proc)
    return fixtures_dir


@pytest.mark.parametrize("name", [n for _, n in STRACE_CASES])
def test_export_reads_no_adam_moment(ckptfs_bin, fixtures_dir, many_dir, tmp_path, name):
    strace = shutil.which("strace")
    if not strace:
        pytest.fail("strace is not installed (apt-get install strace)", pytrace=False)
    info = case_info(fixtures_dir, name)
    src = os.path.join(fixtures_dir, name, info["src"])
    tag_dir = os.path.join(fixtures_dir, name, "checkpoint", info["latest"])
    optim = sorted(os.path.realpath(os.path.join(tag_dir, f)) for f in os.listdir(tag_dir) if "optim_states" in f)
    ranges = {p: storage_ranges(p) for p in optim}
    for p, r in ranges.items():
        tail = os.path.getsize(p) - EOCD_SCAN
        assert all(hi <= tail for _, hi in r["moment"]), f"{p}: a moment lies in the zip tail; pick another case"
    log = tmp_path / "strace" / "log"
    log.parent.mkdir()
    proc = H.run([strace, "-f", "-ff", "-y", "-s", "0", "-e", "trace=pread64", "-o", log,
                  ckptfs_bin, "export", src, tmp_path / "out"], timeout=SLOW_TIMEOUT)
    H.assert_ok(proc)
    reads = strace_preads(str(log))
    for p in optim:
        mine = [(o, o + n) for o, n in reads.get(p, []) if n > 0]
        assert any(overlaps(a, b) for a in mine for b in ranges[p]["fp32"]), \
            f"{p}: no pread64 of its fp32 partitions was traced (does export read another way?)"
        hits = [(a, b) for a in mine for b in ranges[p]["moment"] if overlaps(a, b)]
        assert not hits, f"{os.path.basename(p)}: {len(hits)} pread64 ranges overlap Adam moments, first " \
                         f"{hits[0][0]} overlaps storage bytes {hits[0][1]}"


# ----------------------------------------------------------------------------------------------------
# (e) universal trees as input

def check_fp32_views(root, exp_fp32, exp_model, what):
    H.assert_state_equal(load_pt(os.path.join(root, "fp32", "pytorch_model.bin")), exp_fp32, ordered=True,
                         what=f"{what} fp32/pytorch_model.bin")
    H.assert_state_equal(H.read_safetensors(os.path.join(root, "fp32", "model.safetensors")), exp_fp32,
                         ordered=False, what=f"{what} fp32/model.safetensors")
    H.assert_state_equal(H.read_safetensors(os.path.join(root, "model.safetensors")), exp_model, ordered=False,
                         what=f"{what} model.safetensors")


def test_generated_universal_as_input(uni_mount, fixtures_dir, ckptfs_bin, tmp_path):
    """cp -r of our universal/<tag>_universal (+ latest_universal), mounted alone and as a save dir, serves
    the original tag's fp32/model views (pipeline: their trainable part, in the same order)."""
    info, mnt = uni_mount
    tag = info["latest"]
    t = f"{tag}_universal"
    assert os.path.isdir(os.path.join(mnt, "universal", t)), no_universal_dir(mnt)
    save = tmp_path / "save"
    save.mkdir()
    H.assert_ok(H.run(["cp", "-r", os.path.join(mnt, "universal", t), save / t], timeout=CMD_TIMEOUT))
    shutil.copyfile(os.path.join(mnt, "universal", "latest_universal"), save / "latest_universal")
    exp_dir = os.path.join(fixtures_dir, info["name"], info["expected"][tag])
    exp_fp32 = H.load_expected(os.path.join(exp_dir, "fp32.pt"))
    exp_model = H.load_expected(os.path.join(exp_dir, "model.pt"))
    if info["name"] in PIPELINE_CASES:
        trainable = Expect(fixtures_dir, info["name"], tag).params
        exp_fp32 = {k: v for k, v in exp_fp32.items() if k in trainable}
        exp_model = {k: v for k, v in exp_model.items() if k in trainable}
    for src in (save / t, save):
        with mounted(ckptfs_bin, src, tmp_path / "mnt") as m:
            check_fp32_views(m, exp_fp32, exp_model, f"{info['name']} from {os.path.relpath(src, tmp_path)}")


@pytest.mark.parametrize("name", REAL_CASES)
def test_real_deepspeed_universal_as_input(ckptfs_bin, tmp_path, name):
    """DeepSpeed's own global_step3_universal/, mounted alone and in a save dir with latest_universal: the
    trainable fp32 tensors are DeepSpeed's fp32.pt values (and zero_to_fp32's, where golden_fp32 exists),
    the 16-bit model equals save_16bit_model's where that reference exists."""
    udir = real_path(name, f"{REAL_TAG}_universal")
    layout = UL.model_layout(udir)
    form = UL.form_of(layout)
    ref = {}
    for n, shape in layout.names().items():
        obj = load_pt(os.path.join(udir, "zero", n, "fp32.pt"))
        ref[n] = (obj["param"] if form == "dict" else obj).detach().reshape(shape)
    golden_path = os.path.join(REAL_SETS[name], name, "golden_fp32.pt")
    golden = load_pt(golden_path) if os.path.isfile(golden_path) else None
    m16 = os.path.join(REAL_SETS[name], name, "model_16bit", "pytorch_model.manifest.json")
    save = tmp_path / "save"
    save.mkdir()
    shutil.copytree(udir, save / f"{REAL_TAG}_universal")
    shutil.copyfile(real_path(name, "latest_universal"), save / "latest_universal")
    for src in (udir, save):
        with mounted(ckptfs_bin, src, tmp_path / "mnt") as m:
            what = f"{name} from {'the universal dir' if src == udir else 'a save dir with latest_universal'}"
            ours = load_pt(os.path.join(m, "fp32", "pytorch_model.bin"))
            for n, t in ref.items():
                assert n in ours, f"{what}: fp32/pytorch_model.bin lacks {n}"
                H.assert_tensor_equal(f"{what}: {n}", ours[n], t)
                if golden is not None:
                    H.assert_tensor_equal(f"{what}: {n} vs golden_fp32", ours[n], golden[n])
            H.assert_state_equal(H.read_safetensors(os.path.join(m, "fp32", "model.safetensors")), ours,
                                 ordered=False, what=f"{what} fp32/model.safetensors")
            if os.path.isfile(m16):
                with open(m16) as f:
                    man = json.load(f)
                model = H.read_safetensors(os.path.join(m, "model.safetensors"))
                assert sorted(model) == sorted(man), f"{what}: model.safetensors names"
                for k, v in man.items():
                    assert list(model[k].shape) == v["shape"] and H.sha256_le(model[k]) == v["sha256"], \
                        f"{what}: model.safetensors {k} differs from save_16bit_model"


# ----------------------------------------------------------------------------------------------------
# (e2) many parameters

def test_many_params_tree(many_dir, ckptfs_bin, tmp_path):
    info = case_info(many_dir, MANY)
    tag = info["latest"]
    t = f"{tag}_universal"
    exp = Expect(many_dir, MANY, tag)
    n_params = len(exp.params)
    assert n_params >= 20000
    want = 4 * n_params + 1 + len(exp.copies)
    assert want == info["universal"]["files"]
    with mounted(ckptfs_bin, os.path.join(many_dir, MANY, info["src"]), tmp_path / "mnt") as mnt:
        root = os.path.join(mnt, "universal")
        assert os.path.isdir(root), no_universal_dir(mnt)
        ls = H.run(["ls", "-lR", root], timeout=SLOW_TIMEOUT)
        H.assert_ok(ls)
        sizes, current = {}, None
        for line in ls.stdout.splitlines():
            if line.endswith(":") and line.startswith(root):
                current = line[:-1]
            elif line.startswith("-"):
                parts = line.split(None, 8)
                sizes[os.path.relpath(os.path.join(current, parts[8]), root)] = int(parts[4])
        assert sum(1 for p in sizes if p.startswith(t + "/")) == want, \
            f"ls -lR lists {len(sizes)} files, expected {want} under {t}/ + latest_universal"
        assert_set_equal(set(sizes), exp.file_set()[0], "ls -lR universal/")
        du = H.run(["du", "-sb", root], timeout=SLOW_TIMEOUT)
        H.assert_ok(du)
        assert int(du.stdout.split()[0]) == sum(sizes.values()), "du -sb != sum of the listed sizes"
        assert len(os.listdir(os.path.join(mnt, "tags", tag, "universal", t, "zero"))) == n_params + 1
        names = list(exp.params)
        sample = sorted(set(names[:3] + names[-3:] + names[::997]))
        check_generated_tree(root, exp, params=sample)
        for n in sample:
            assert os.stat(os.path.join(root, t, "zero", n, "fp32.pt")).st_size == sizes[f"{t}/zero/{n}/fp32.pt"]
