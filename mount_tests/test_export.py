"""`ckptfs export` / `ckptfs inspect` on every generated case, compared bit for bit with the expectations
the generator computed from its master values (mount_tests/gen/generate.py)."""
import json
import os
import re

import pytest
import torch

import helpers as H
from conftest import case_info
from gen import generate
from gen.generate import make_cases

CASES = [c["name"] for c in make_cases()]
MULTI_TAG = [c["name"] for c in make_cases() if len(c["tags"]) > 1]


def src_of(fixtures_dir, name):
    return os.path.join(fixtures_dir, name, case_info(fixtures_dir, name)["src"])


def expected(fixtures_dir, name, tag=None):
    info = case_info(fixtures_dir, name)
    d = os.path.join(fixtures_dir, name, info["expected"][tag or info["latest"]])
    return H.load_expected(os.path.join(d, "fp32.pt")), H.load_expected(os.path.join(d, "model.pt"))


def exported(export_cache, fixtures_dir, name, tag=None):
    proc, out = export_cache(src_of(fixtures_dir, name), tag)
    H.assert_ok(proc)
    return out


@pytest.mark.parametrize("name", CASES)
def test_export_fp32_bin(export_cache, fixtures_dir, name):
    out = exported(export_cache, fixtures_dir, name)
    path = out / "fp32" / "pytorch_model.bin"
    assert path.is_file(), f"missing {path}"
    ours = torch.load(path, map_location="cpu", weights_only=True)
    assert isinstance(ours, dict), type(ours)
    exp_fp32, _ = expected(fixtures_dir, name)
    H.assert_state_equal(ours, exp_fp32, ordered=True, what=f"{name} fp32/pytorch_model.bin")


@pytest.mark.parametrize("name", CASES)
def test_export_fp32_safetensors(export_cache, fixtures_dir, name):
    out = exported(export_cache, fixtures_dir, name)
    ours = H.read_safetensors(out / "fp32" / "model.safetensors")
    exp_fp32, _ = expected(fixtures_dir, name)
    H.assert_state_equal(ours, exp_fp32, ordered=False, what=f"{name} fp32/model.safetensors")


@pytest.mark.parametrize("name", CASES)
def test_export_model_safetensors(export_cache, fixtures_dir, name):
    out = exported(export_cache, fixtures_dir, name)
    ours = H.read_safetensors(out / "model.safetensors")
    _, exp_model = expected(fixtures_dir, name)
    H.assert_state_equal(ours, exp_model, ordered=False, what=f"{name} model.safetensors")


@pytest.mark.parametrize("name", MULTI_TAG)
def test_export_older_tag(export_cache, fixtures_dir, name):
    info = case_info(fixtures_dir, name)
    for tag in info["tags"]:
        if tag == info["latest"]:
            continue
        out = exported(export_cache, fixtures_dir, name, tag)
        exp_fp32, exp_model = expected(fixtures_dir, name, tag)
        ours = torch.load(out / "fp32" / "pytorch_model.bin", map_location="cpu", weights_only=True)
        H.assert_state_equal(ours, exp_fp32, ordered=True, what=f"{name} --tag {tag} fp32/pytorch_model.bin")
        H.assert_state_equal(H.read_safetensors(out / "model.safetensors"), exp_model, ordered=False,
                             what=f"{name} --tag {tag} model.safetensors")
        # and the latest tag really differs, so the test above proves --tag was honoured
        latest_fp32, _ = expected(fixtures_dir, name)
        assert any(H.tensor_bytes(latest_fp32[k]) != H.tensor_bytes(v) for k, v in exp_fp32.items())


def _inspect(ckptfs_bin, fixtures_dir, name, *flags):
    proc = H.run([ckptfs_bin, "inspect", src_of(fixtures_dir, name), *flags])
    H.assert_ok(proc)
    return proc.stdout


@pytest.mark.parametrize("name", CASES)
def test_inspect_text(ckptfs_bin, fixtures_dir, name):
    info = case_info(fixtures_dir, name)
    text = _inspect(ckptfs_bin, fixtures_dir, name)
    assert re.search(rf"ZeRO[- ]?(stage[ -]?)?{info['stage']}\b", text, re.I), f"ZeRO stage not shown:\n{text}"
    assert re.search(rf"\b(DP|data[- ]parallel)\b\D{{0,12}}\b{info['dp']}\b", text, re.I), f"DP size not shown:\n{text}"


@pytest.mark.parametrize("name", CASES)
def test_inspect_json(ckptfs_bin, fixtures_dir, export_cache, name):
    text = _inspect(ckptfs_bin, fixtures_dir, name, "--json")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise AssertionError(f"inspect --json is not JSON ({e}):\n{text[:2000]}") from None
    info = case_info(fixtures_dir, name)
    assert doc["framework"] == "deepspeed" and doc["latest"] == info["latest"]
    assert [t["name"] for t in doc["tags"]] == info["tags"]
    tag = next(t for t in doc["tags"] if t["name"] == info["latest"])
    topo = tag["topology"]
    assert topo["zero_stage"] == info["stage"] and topo["dp"] == info["dp"], topo
    assert topo["pp"] == (2 if info["pipeline"] else 1) and topo["tp"] == 1, topo
    assert topo["train_dtype"] == {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[info["dtype"]], topo
    exp_fp32, exp_model = expected(fixtures_dir, name)
    assert tag["tensor_count"]["fp32"] == len(exp_fp32) and tag["tensor_count"]["model"] == len(exp_model), tag
    sizes = {v["path"]: v["size"] for v in tag["views"]}
    out = exported(export_cache, fixtures_dir, name)
    for view in ("model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors"):
        assert sizes[view] == os.path.getsize(out / view), view


def expected_catalogs(fixtures_dir, name):
    """{catalog role: {name: tensor}} the generator expects ckptfs to list for the latest tag: fp32 and model,
    and, where the tag has partitioned optimizer state (universal.pt), the Adam moments of every param that has
    them, in the param's shape (ZeRO-3's universal files are flat)."""
    info = case_info(fixtures_dir, name)
    exp_fp32, exp_model = expected(fixtures_dir, name)
    out = {"fp32": exp_fp32, "model": exp_model}
    universal = os.path.join(fixtures_dir, name, info["expected"][info["latest"]], "universal.pt")
    if os.path.isfile(universal):
        state = H.load_expected(universal)
        for moment in ("exp_avg", "exp_avg_sq"):
            out[moment] = {p: files[moment].reshape(exp_fp32[p].shape) for p, files in state.items() if moment in files}
    return out


def origin_rule(case, entry):
    """A regular expression the origin of `entry`'s fp32 tensor must match, from what the generator wrote it
    as: a buffer, a frozen param, a tied alias, or a trainable param's master in its param group (ZeRO-3:
    its sub-group; FP16_Optimizer: fp32_groups_flat[g]; FP16_UnfusedOptimizer: fp32_groups[g]); ZeRO-0 with a
    torch optimizer keeps no master: the module's value, upcast."""
    if case["optimizer"] == "torch":
        return r"module\b"
    if entry.kind == "alias":
        return re.escape(f"tied to {entry.owner}") + "$"
    if entry.kind in ("buffer", "frozen"):
        return rf"{entry.kind}\b"
    if case["stage"] == 3:
        return rf".*\bsub-group {entry.subgroup}\b"
    if case["optimizer"] == "fp16_optimizer":
        return rf".*\bfp32_groups_flat\[{entry.group}\]"
    if case["optimizer"] == "fp16_unfused":
        return rf".*\bfp32_groups\[{entry.group}\]"
    return rf".*\bgroup {entry.group}\b"


def text_catalogs(text, tag):
    """{role: [(name, dtype, shape, origin)]} of one tag's section of `inspect --tensors` text."""
    section = text.split(f"\ntag {tag}  (", 1)[1].split("\ntag ", 1)[0]
    out, role = {}, None
    for line in section.splitlines():
        head = re.fullmatch(r"  (\S+) tensors \((\d+)\):", line)
        if head:
            role = head.group(1)
            out[role] = []
        elif role and line.startswith("    "):
            row = re.fullmatch(r"    (\S+)\s+(\S+)\s+(\[[\d, ]*\])\s*(.*)", line)
            assert row, f"unparsable tensor line {line!r}"
            out[role].append((row.group(1), row.group(2), json.loads(row.group(3)), row.group(4).strip()))
    return out


@pytest.mark.parametrize("name", CASES)
def test_inspect_tensors(ckptfs_bin, fixtures_dir, name):
    """`inspect --tensors` (text and --json) lists, per catalog, exactly the generator's tensors in the order of
    its files, each with the expected dtype and shape, and an origin that says what the generator made it."""
    info = case_info(fixtures_dir, name)
    case = next(c for c in make_cases() if c["name"] == name)
    want = expected_catalogs(fixtures_dir, name)
    doc = json.loads(_inspect(ckptfs_bin, fixtures_dir, name, "--json", "--tensors"))
    tag = next(t for t in doc["tags"] if t["name"] == info["latest"])
    listed_json = {role: [(r["name"], r["dtype"], r["shape"], r["origin"]) for r in rows]
                   for role, rows in tag["tensors"].items()}
    listed_text = text_catalogs(_inspect(ckptfs_bin, fixtures_dir, name, "--tensors"), info["latest"])
    assert listed_text == listed_json, "inspect --tensors and --json --tensors disagree"
    assert set(want) <= set(listed_json), f"catalogs {sorted(listed_json)}, expected at least {sorted(want)}"
    for role, exp in want.items():
        rows = listed_json[role]
        assert [r[0] for r in rows] == list(exp), f"{role}: names or order differ from the generator's"
        for n, dtype, shape, _ in rows:
            assert (dtype, shape) == (str(exp[n].dtype).removeprefix("torch."), list(exp[n].shape)), f"{role} {n}"
    entries = {e.name: e for e in generate.entries_of(case)}
    checked = 0
    for n, _, _, origin in listed_json["fp32"]:
        if n in entries:  # pipeline stages rename (layer numbers, tied_modules.)
            assert re.match(origin_rule(case, entries[n]), origin), f"fp32 {n}: origin {origin!r}"
            checked += 1
    assert checked or case["pipeline"], "no origin checked"


@pytest.mark.bench
def test_export_bench(ckptfs_bin, tmp_path):
    """Opt-in (CKPTFS_BENCH=1): the 64-rank ZeRO-3 benchmark checkpoint (>= 1 GB fp32 master) exports to
    the sha256 manifests the generator computed parameter by parameter."""
    if os.environ.get("CKPTFS_BENCH") != "1":
        pytest.skip("benchmark fixture is opt-in: set CKPTFS_BENCH=1 (generates ~3 GB)")
    import sys
    from conftest import GENERATOR, _abs
    root = _abs(os.environ.get("CKPTFS_FIXTURES", "build/fixtures"))
    H.assert_ok(H.run([sys.executable, GENERATOR, root, "--only", "bench_z3_dp64"], timeout=900))
    case = os.path.join(root, "bench_z3_dp64")
    out = tmp_path / "out"
    H.assert_ok(H.run([ckptfs_bin, "export", os.path.join(case, "checkpoint"), out], timeout=900))
    for view, man in (("fp32/model.safetensors", "fp32.manifest.json"), ("model.safetensors", "model.manifest.json")):
        with open(os.path.join(case, "expected", man)) as f:
            ref = json.load(f)
        ours = H.read_safetensors(out / view)
        assert sorted(ours) == sorted(ref), view
        for k, m in ref.items():
            assert str(ours[k].dtype) == "torch." + m["dtype"] and list(ours[k].shape) == m["shape"], f"{view}: {k}"
            assert H.sha256_le(ours[k]) == m["sha256"], f"{view}: {k} differs"
    ours = torch.load(out / "fp32" / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True) \
        if "mmap" in torch.load.__code__.co_varnames else None
    if ours is not None:
        with open(os.path.join(case, "expected", "fp32.manifest.json")) as f:
            assert list(ours) == list(json.load(f))
