"""Exact comparison of nested state dicts (what torch.load gives for full_state.pt and for
dcp_to_torch_save's output): same types (dict is not OrderedDict), same key order, tensors with the same
dtype, shape, strides and bytes, floats bit for bit, BytesIO by content and position.  Works with torch
1.13 (host) and 2.x (chroot); used by test_dcp.py and chroot_dcp_clients.py.
"""
import io
import struct

import torch


def tensor_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _tname(x):
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def first_tensor_diff(a, b):
    x, y = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    for i in range(x.numel()):
        if tensor_bytes(x[i:i + 1]) != tensor_bytes(y[i:i + 1]):
            n = sum(tensor_bytes(x[j:j + 1]) != tensor_bytes(y[j:j + 1]) for j in range(x.numel()))
            return f"{n} of {x.numel()} elements differ; first at flat index {i}: ours {x[i].item()!r} expected {y[i].item()!r}"
    return "bytes differ"


def tensor_diff(path, ours, exp, strides=True):
    if ours.dtype != exp.dtype:
        return f"{path}: dtype {ours.dtype}, expected {exp.dtype}"
    if tuple(ours.shape) != tuple(exp.shape):
        return f"{path}: shape {tuple(ours.shape)}, expected {tuple(exp.shape)}"
    if strides and ours.numel() > 1 and tuple(ours.stride()) != tuple(exp.stride()):
        return f"{path}: strides {tuple(ours.stride())}, expected {tuple(exp.stride())}"
    if tensor_bytes(ours) != tensor_bytes(exp):
        return f"{path}: {first_tensor_diff(ours, exp)}"
    return None


def deep_diff(ours, exp, path="$"):
    """None when `ours` equals `exp` exactly, else a description of the first difference."""
    if type(ours) is not type(exp):
        return f"{path}: type {_tname(ours)}, expected {_tname(exp)} ({exp!r:.80})"
    if isinstance(exp, torch.Tensor):
        return tensor_diff(path, ours, exp)
    if isinstance(exp, dict):
        ok, ek = list(ours), list(exp)
        if ok != ek:
            missing = [k for k in ek if k not in ours]
            extra = [k for k in ok if k not in exp]
            if missing or extra:
                return f"{path}: keys missing {missing[:10]}, unexpected {extra[:10]}"
            return f"{path}: key order {ok[:20]}, expected {ek[:20]}"
        for k in ek:
            d = deep_diff(ours[k], exp[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(exp, (list, tuple)):  # torch.Size too (type checked above)
        if len(ours) != len(exp):
            return f"{path}: length {len(ours)}, expected {len(exp)}"
        for i, (a, b) in enumerate(zip(ours, exp)):
            d = deep_diff(a, b, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(exp, float):
        if struct.pack("<d", ours) != struct.pack("<d", exp):
            return f"{path}: {ours!r}, expected {exp!r}"
        return None
    if isinstance(exp, io.BytesIO):
        if ours.getvalue() != exp.getvalue() or ours.tell() != exp.tell():
            return f"{path}: BytesIO {ours.getvalue()[:40]!r}@{ours.tell()}, expected {exp.getvalue()[:40]!r}@{exp.tell()}"
        return None
    if ours != exp:
        return f"{path}: {ours!r:.100}, expected {exp!r:.100}"
    return None


def state_diff(ours, exp, ordered, what, strides=False):
    """Flat name -> tensor dicts (model/fp32 views)."""
    ok, ek = list(ours), list(exp)
    missing = [k for k in ek if k not in ours]
    extra = [k for k in ok if k not in exp]
    if missing or extra:
        return f"{what}: missing {missing}, unexpected {extra}"
    if ordered and ok != ek:
        return f"{what}: key order differs:\n ours     {ok}\n expected {ek}"
    for k in ek:
        d = tensor_diff(f"{what}: {k}", ours[k], exp[k], strides=strides)
        if d:
            return d
    return None


def flatten_like_dcp(state, prefix=()):
    """[(flat key, value)] as DCP's planner flattens a state dict (torch >= 2.4): mappings are always
    descended, lists only when they hold a tensor or a mapping somewhere below, everything else is a leaf;
    keys are the path parts joined with '.'."""
    def terminal(v):
        if isinstance(v, dict):
            return False
        if not isinstance(v, list):
            return True
        for e in v:
            if isinstance(e, (dict, list)) and not terminal(e):
                return False
            if isinstance(e, torch.Tensor):
                return False
        return True

    out = []
    if isinstance(state, dict) and not prefix:
        items = [((str(k),), v) for k, v in state.items()]
    elif isinstance(state, dict):
        items = [(prefix + (str(k),), v) for k, v in state.items()]
    else:
        items = [(prefix + (i,), v) for i, v in enumerate(state)]
    for path, v in items:
        if terminal(v):
            out.append((".".join(str(p) for p in path), v))
        else:
            out.extend(flatten_like_dcp(v, path))
    return out
