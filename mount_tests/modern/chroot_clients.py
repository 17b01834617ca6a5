"""Runs inside the Debian 13 chroot (torch 2.x, the reference safetensors library): reads a ckptfs mount
with the modern clients and compares every tensor bit for bit with the generator's expectations.

    python3 chroot_clients.py MNT EXPECTED_DIR

EXPECTED_DIR holds the case's model.pt and fp32.pt (torch.save zips written by the host's torch).

    python3 chroot_clients.py --manifests SPEC.json

SPEC: {"scratch": dir, "views": [{"label": str, "path": a .safetensors or .bin view, "ordered": bool,
"tensors": {name: {"dtype", "shape", "sha256", "hashed_as"?}}}, ...]}: every view's tensors against golden
manifests (sha256 of the contiguous little-endian bytes, after a cast to "hashed_as" where the golden keeps
another dtype), read with safe_open, load_file and save_file's bytes (.safetensors) or with
torch.load(weights_only=True) mmap=True and mmap=False (.bin, in the manifest's order when "ordered").

Prints one PASS/FAIL line per check and a summary; exits 1 if any check failed.
"""
import hashlib
import json
import os
import sys
import traceback

import safetensors
import safetensors.torch
import torch
from safetensors import safe_open


def as_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def first_diff(a, b):
    x, y = as_bytes(a), as_bytes(b)
    idx = (x != y).nonzero()
    i = int(idx[0]) // a.element_size() if len(idx) else -1
    fa, fb = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    return f"{len(idx)} bytes differ; first in element {i}: ours {fa[i].item()!r} expected {fb[i].item()!r}"


def same_tensor(what, ours, exp):
    assert ours.dtype == exp.dtype, f"{what}: dtype {ours.dtype}, expected {exp.dtype}"
    assert tuple(ours.shape) == tuple(exp.shape), f"{what}: shape {tuple(ours.shape)}, expected {tuple(exp.shape)}"
    if not torch.equal(as_bytes(ours), as_bytes(exp)):
        raise AssertionError(f"{what}: {first_diff(ours, exp)}")


def same_state(what, ours, exp, ordered):
    missing = [k for k in exp if k not in ours]
    extra = [k for k in ours if k not in exp]
    assert not missing and not extra, f"{what}: missing {missing}, unexpected {extra}"
    if ordered:
        assert list(ours) == list(exp), f"{what}: key order {list(ours)}, expected {list(exp)}"
    for k in exp:
        same_tensor(f"{what}: {k}", ours[k], exp[k])
    return len(exp)


def check_safe_open(path, exp, same=same_tensor, columns=False):
    """safe_open(path): metadata, the keys of `exp`, every tensor and a partial read through get_slice of the
    first dim (with `columns`, of the second too); same(what, ours, expected) raises AssertionError on a
    difference.  Shared with gen_dcp/chroot_dcp_clients.py (test_dcp.py stages this file beside it)."""
    n = 0
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}, f"metadata {f.metadata()!r}"
        keys = list(f.keys())
        assert sorted(keys) == sorted(exp), f"keys {sorted(keys)}, expected {sorted(exp)}"
        for k in keys:
            same(k, f.get_tensor(k), exp[k])
            t = exp[k]
            if t.dim() >= 1 and t.shape[0] > 2:  # a partial read through get_slice
                lo, hi = 1, t.shape[0] - 1
                same(f"{k}[{lo}:{hi}]", f.get_slice(k)[lo:hi], t[lo:hi])
            if columns and t.dim() >= 2 and t.shape[1] > 2:
                same(f"{k}[:, 1:2]", f.get_slice(k)[:, 1:2], t[:, 1:2].contiguous())
            n += 1
    return n


def written_by_save_file(path, exp, scratch):
    """The file at `path` is byte for byte what the reference writer (safetensors.torch.save_file, as
    zero_to_fp32 --safe_serialization and save_pretrained call it) makes of the expected tensors."""
    ref = os.path.join(scratch, "save_file.safetensors")
    safetensors.torch.save_file({k: t.clone().contiguous() for k, t in exp.items()}, ref,
                                metadata={"format": "pt"})
    with open(path, "rb") as a, open(ref, "rb") as b:
        ours, theirs = a.read(), b.read()
    os.remove(ref)
    if ours != theirs:
        at = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
        raise AssertionError(f"{len(ours)} bytes against save_file's {len(theirs)}; first difference at byte {at}")
    return 1


def print_versions():
    print(f"clients: torch {torch.__version__}, safetensors {safetensors.__version__}")


def run_checks(checks, prefix="", unit="tensors"):
    """Runs each (name, fn) of `checks` (fn returns a count), one PASS/FAIL line each; returns how many failed."""
    failed = 0
    for name, fn in checks:
        try:
            n = fn()
            print(f"PASS {prefix}{name} ({n} {unit})")
        except Exception as e:  # noqa: BLE001 (report every check)
            failed += 1
            detail = str(e) if isinstance(e, AssertionError) else traceback.format_exc(limit=3)
            print(f"FAIL {prefix}{name}: {detail}")
    return failed


def summary(total, failed):
    """Prints the summary line; returns the exit status."""
    print(f"summary: {total - failed} of {total} checks passed")
    return 1 if failed else 0


def matches_manifest(what, state, manifest, ordered=False):
    """`state` holds exactly the manifest's tensors, each with its dtype, shape and bytes (by sha256)."""
    missing = [k for k in manifest if k not in state]
    extra = [k for k in state if k not in manifest]
    assert not missing and not extra, f"{what}: missing {missing}, unexpected {extra}"
    if ordered:
        assert list(state) == list(manifest), f"{what}: key order {list(state)}, expected {list(manifest)}"
    for k, m in manifest.items():
        t = state[k]
        assert (str(t.dtype), list(t.shape)) == (f"torch.{m['dtype']}", m["shape"]), \
            f"{what}: {k}: {t.dtype} {list(t.shape)}, expected {m['dtype']} {m['shape']}"
        hashed = t.to(getattr(torch, m["hashed_as"])) if "hashed_as" in m else t
        assert hashlib.sha256(as_bytes(hashed).numpy().tobytes()).hexdigest() == m["sha256"], \
            f"{what}: {k}: bytes differ from the golden (sha256)" + (f" as {m['hashed_as']}" if "hashed_as" in m else "")
    return len(manifest)


def safe_open_against_manifest(path, manifest):
    """Every tensor through safe_open against the manifest, then (check_safe_open) the metadata and partial
    reads through get_slice against those full reads."""
    with safe_open(path, framework="pt") as f:
        read = {k: f.get_tensor(k) for k in f.keys()}
    matches_manifest("safe_open", read, manifest)
    return check_safe_open(path, read, columns=True)


def manifest_checks(view, scratch):
    path, manifest = view["path"], view["tensors"]
    if path.endswith(".safetensors"):
        return [("safe_open", lambda: safe_open_against_manifest(path, manifest)),
                ("safetensors.torch.load_file",
                 lambda: matches_manifest("load_file", safetensors.torch.load_file(path), manifest)),
                ("is save_file's file of the tensors read",
                 lambda: written_by_save_file(path, safetensors.torch.load_file(path), scratch))]
    return [(f"torch.load weights_only mmap={mmap}",
             lambda mmap=mmap: matches_manifest("torch.load", torch.load(path, weights_only=True, mmap=mmap),
                                                manifest, view["ordered"]))
            for mmap in (True, False)]


def main_manifests(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    print_versions()
    failed = total = 0
    for view in spec["views"]:
        checks = manifest_checks(view, spec["scratch"])
        total += len(checks)
        failed += run_checks(checks, prefix=f"{view['label']}: ")
    return summary(total, failed)


def main(argv):
    if argv[1] == "--manifests":
        return main_manifests(argv[2])
    mnt, exp_dir = argv[1], argv[2]
    exp_model = torch.load(os.path.join(exp_dir, "model.pt"), map_location="cpu", weights_only=True)
    exp_fp32 = torch.load(os.path.join(exp_dir, "fp32.pt"), map_location="cpu", weights_only=True)
    model_st = os.path.join(mnt, "model.safetensors")
    fp32_st = os.path.join(mnt, "fp32", "model.safetensors")
    fp32_bin = os.path.join(mnt, "fp32", "pytorch_model.bin")
    checks = [
        ("model.safetensors is save_file's file", lambda: written_by_save_file(model_st, exp_model, exp_dir)),
        ("fp32/model.safetensors is save_file's file", lambda: written_by_save_file(fp32_st, exp_fp32, exp_dir)),
        ("safe_open model.safetensors", lambda: check_safe_open(model_st, exp_model)),
        ("safe_open fp32/model.safetensors", lambda: check_safe_open(fp32_st, exp_fp32)),
        ("safetensors.torch.load_file model.safetensors",
         lambda: same_state("load_file", safetensors.torch.load_file(model_st), exp_model, False)),
        ("safetensors.torch.load_file fp32/model.safetensors",
         lambda: same_state("load_file", safetensors.torch.load_file(fp32_st), exp_fp32, False)),
        ("torch.load fp32/pytorch_model.bin weights_only mmap=True",
         lambda: same_state("torch.load", torch.load(fp32_bin, weights_only=True, mmap=True), exp_fp32, True)),
        ("torch.load fp32/pytorch_model.bin weights_only mmap=False",
         lambda: same_state("torch.load", torch.load(fp32_bin, weights_only=True, mmap=False), exp_fp32, True)),
    ]
    print_versions()
    return summary(len(checks), run_checks(checks))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
