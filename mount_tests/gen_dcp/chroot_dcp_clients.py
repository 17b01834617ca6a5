"""Runs inside the Debian 13 chroot (torch 2.x, the reference safetensors library): reads the DCP views of
a ckptfs mount with modern clients and compares them with PyTorch's own results, bit for bit.

    python3 chroot_dcp_clients.py SPEC.json

SPEC: {"checks": [{"label": str, "dir": mounted tag root, "model": model.pt, "fp32": fp32.pt,
                   "full_state": [[view path relative to dir, expected .pt], ...]}, ...]}
or, instead of "model"/"fp32", "golden": a state .pt whose "model" dict is the model view and whose fp32
view this client derives with torch's own `.float()` (8- and 16-bit floats; other dtypes as they are),
plus "weights_only": true to load each full_state view with weights_only=True as well, and
"save_file": a scratch dir (or true: the golden's dir) to check model.safetensors and fp32/model.safetensors
byte for byte against safetensors.torch.save_file of the expected tensors (torch 2.x clients can hold
float8 and uint16-64, which the host's torch 1.13 cannot).
Per tag root: safe_open of model.safetensors and fp32/model.safetensors (every tensor, get_slice of the
first dims), torch.load(fp32/pytorch_model.bin, mmap=True, weights_only=True) in order, and
torch.load(<full_state view>, mmap=True, weights_only=False) against dcp_to_torch_save's file loaded the
same way; with "save_file", both .safetensors views byte for byte against safetensors.torch.save_file of the
expected tensors.  One PASS/FAIL line per check; exit 1 if any failed.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "modern"))  # in the tree; staged: beside this file
from chroot_clients import check_safe_open, print_versions, run_checks, summary, written_by_save_file  # noqa: E402
from dcp_compare import deep_diff, state_diff, tensor_diff  # noqa: E402


def same_tensor(what, ours, exp):
    d = tensor_diff(what, ours, exp, strides=False)
    assert d is None, d


def check_st(path, exp):
    return check_safe_open(path, exp, same_tensor, columns=True)


def check_bin(path, exp):
    d = state_diff(torch.load(path, map_location="cpu", weights_only=True, mmap=True), exp, True, "pytorch_model.bin")
    assert d is None, d
    return len(exp)


def check_full(path, exp_path, weights_only=False):
    exp = torch.load(exp_path, map_location="cpu", weights_only=False, mmap=True)
    ours = torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    d = deep_diff(ours, exp)
    assert d is None, d
    return len(exp)


def upcast(t):
    """What the fp32/ views hold: 8- and 16-bit floats widened by torch itself, the rest as it is."""
    return t.float() if t.is_floating_point() and t.element_size() < 4 else t


def expected_views(c):
    if "golden" in c:
        golden = torch.load(c["golden"], map_location="cpu", weights_only=False)
        model = {k: v.contiguous() for k, v in golden["model"].items()}
        return model, {k: upcast(v) for k, v in model.items()}
    return (torch.load(c["model"], map_location="cpu", weights_only=True),
            torch.load(c["fp32"], map_location="cpu", weights_only=True))


def main(argv):
    with open(argv[1]) as f:
        spec = json.load(f)
    print_versions()
    failed = total = 0
    for c in spec["checks"]:
        exp_model, exp_fp32 = expected_views(c)
        d = c["dir"]
        checks = [
            ("safe_open model.safetensors", lambda: check_st(os.path.join(d, "model.safetensors"), exp_model)),
            ("safe_open fp32/model.safetensors",
             lambda: check_st(os.path.join(d, "fp32", "model.safetensors"), exp_fp32)),
            ("torch.load fp32/pytorch_model.bin mmap=True",
             lambda: check_bin(os.path.join(d, "fp32", "pytorch_model.bin"), exp_fp32)),
        ]
        if c.get("save_file"):
            scratch = c["save_file"] if isinstance(c["save_file"], str) else os.path.dirname(c["golden"])
            checks += [(f"{v} is save_file's file", lambda v=v, e=e: written_by_save_file(os.path.join(d, v), e, scratch))
                       for v, e in (("model.safetensors", exp_model), ("fp32/model.safetensors", exp_fp32))]
        for view, exp in c["full_state"]:
            for weights_only in (False, True) if c.get("weights_only") else (False,):
                checks.append((f"torch.load {view} mmap=True weights_only={weights_only}",
                               lambda view=view, exp=exp, w=weights_only: check_full(os.path.join(d, view), exp, w)))
        total += len(checks)
        failed += run_checks(checks, prefix=f"{c['label']}: ", unit="entries")
    return summary(total, failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
