"""Helpers for the ckptfs end-to-end tests: running the binary, an independent safetensors reader, bit-exact
tensor comparison, and a small pure-Python merge (zero_to_fp32-like, with ckptfs's documented fixes) used
only to cross-check the fixture generator — the tests compare ckptfs output with the expectation files.
"""
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "gen"))
import deepspeed_classes  # noqa: E402

deepspeed_classes.install()

EXIT_USAGE, EXIT_SOURCE, EXIT_INVALID, EXIT_UNSUPPORTED, EXIT_OUTPUT = 2, 3, 4, 5, 7
DEFAULT_TIMEOUT = float(os.environ.get("CKPTFS_TEST_TIMEOUT", "120"))


# ----------------------------------------------------------------------------------------------------
# running ckptfs

def run(args, timeout=DEFAULT_TIMEOUT, **kw):
    """Runs a command, captures text output; a timeout is a test failure with the command named."""
    try:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"timed out after {timeout}s: {' '.join(map(str, args))}\n"
                             f"stdout: {e.stdout!r}\nstderr: {e.stderr!r}") from None


def run_with_terminal_stderr(args, timeout=60):
    """Runs a command with stderr a terminal (a pty) and stdout discarded: (exit code, what it drew there)."""
    master, slave = os.openpty()
    try:
        r = subprocess.run([str(a) for a in args], stderr=slave, stdout=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        os.close(slave)
        slave = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the terminal's other side is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    return r.returncode, drawn


def describe(proc):
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def assert_ok(proc):
    assert proc.returncode == 0, describe(proc)


def assert_one_line_error(proc, code, names):
    """Exit ``code``, no signal, stderr one line naming one of ``names`` (file names), no traceback."""
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}\n{describe(proc)}"
    assert proc.returncode == code, f"expected exit {code}\n{describe(proc)}"
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected a one-line error message\n{describe(proc)}"
    low = lines[0]
    for bad in ("Traceback", "terminate called", "Segmentation", "Aborted", "core dumped"):
        assert bad not in proc.stderr, describe(proc)
    if names:
        assert any(n in low for n in names), f"message names none of {names}\n{describe(proc)}"


# ----------------------------------------------------------------------------------------------------
# safetensors (own reader, rules of the reference implementation)

ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool}


def read_safetensors(path):
    """Parses and validates a safetensors file; returns {name: tensor} in header order."""
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) == os.path.getsize(path), f"{path}: read {len(raw)} bytes, stat says {os.path.getsize(path)}"
    return parse_safetensors(raw, path)


def parse_safetensors(raw, path):
    """Parses and validates the bytes ``raw`` of a safetensors file (``path`` names it in messages); returns
    {name: tensor} in header order."""
    size = len(raw)
    assert size >= 8, f"{path}: shorter than the 8-byte header length"
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, f"{path}: header length {n} is not a multiple of 8"
    assert 8 + n <= size, f"{path}: header length {n} past end of file ({size})"
    hdr_bytes = raw[8: 8 + n]
    assert hdr_bytes[:1] == b"{", f"{path}: header does not start with '{{'"
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"{path}: duplicate keys in header"
        return dict(pairs)
    header = json.loads(hdr_bytes.decode("utf-8"), object_pairs_hook=no_duplicates)
    assert isinstance(header, dict)
    meta = header.pop("__metadata__", None)
    assert meta == {"format": "pt"}, f"{path}: __metadata__ is {meta!r}"
    spans = []
    for name, info in header.items():
        assert set(info) == {"dtype", "shape", "data_offsets"}, f"{path}: {name}: keys {sorted(info)}"
        assert info["dtype"] in ST_DTYPES, f"{path}: {name}: dtype {info['dtype']}"
        b, e = info["data_offsets"]
        assert isinstance(b, int) and isinstance(e, int) and 0 <= b <= e
        dt = ST_DTYPES[info["dtype"]]
        item = torch.empty(0, dtype=dt).element_size()
        numel = math.prod(info["shape"])
        assert e - b == numel * item, f"{path}: {name}: {e - b} bytes for shape {info['shape']} {info['dtype']}"
        assert (8 + n + b) % item == 0, f"{path}: {name}: data at file offset {8 + n + b} not {item}-aligned"
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        assert b == pos, f"{path}: {name}: data starts at {b}, expected {pos} (hole or overlap)"
        pos = e
    assert 8 + n + pos == size, f"{path}: data ends at {8 + n + pos}, file has {size} bytes"
    out = {}
    base = 8 + n
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = ST_DTYPES[info["dtype"]]
        buf = bytearray(raw[base + b: base + e])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dt).reshape(info["shape"]) if dt != torch.uint8 else t.reshape(info["shape"])
    return out


# ----------------------------------------------------------------------------------------------------
# comparison

def tensor_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def sha256_le(t):
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def first_diff(a, b):
    x, y = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    if x.dtype.is_floating_point:
        ix = x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
        iy = y.view(ix.dtype)
        idx = (ix != iy).nonzero()
    else:
        idx = (x != y).nonzero()
    if len(idx) == 0:
        return "no element differs"
    i = int(idx[0])
    return f"{len(idx)} of {x.numel()} elements differ; first at flat index {i}: ours {x[i].item()!r} expected {y[i].item()!r}"


def assert_tensor_equal(name, ours, exp):
    assert ours.dtype == exp.dtype, f"{name}: dtype {ours.dtype}, expected {exp.dtype}"
    assert tuple(ours.shape) == tuple(exp.shape), f"{name}: shape {tuple(ours.shape)}, expected {tuple(exp.shape)}"
    if tensor_bytes(ours) != tensor_bytes(exp):
        raise AssertionError(f"{name}: bytes differ ({first_diff(ours, exp)})")


def assert_state_equal(ours, exp, ordered, what):
    ok, ek = list(ours.keys()), list(exp.keys())
    missing = [k for k in ek if k not in ours]
    extra = [k for k in ok if k not in exp]
    assert not missing and not extra, f"{what}: missing {missing}, unexpected {extra}"
    if ordered:
        assert ok == ek, f"{what}: key order differs:\n ours     {ok}\n expected {ek}"
    for k in ek:
        assert_tensor_equal(f"{what}: {k}", ours[k], exp[k])


def load_expected(path):
    return torch.load(path, map_location="cpu", weights_only=True)


# ----------------------------------------------------------------------------------------------------
# reference merge (cross-checks the generator; never used to judge ckptfs)

def _natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def resolve_tag_dir(src, tag=None):
    if tag:
        return os.path.join(src, tag)
    latest = os.path.join(src, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(src, f.read().strip())
    return src


def reference_merge(src, tag=None):
    """Returns (fp32 dict, model dict) following ckptfs's documented semantics."""
    d = resolve_tag_dir(src, tag)
    files = sorted(os.listdir(d), key=_natural_key)
    layer_files = [f for f in files if re.fullmatch(r"layer_\d+-model_states\.pt", f)]
    z3_models = [f for f in files if re.fullmatch(r"zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt", f)]
    optim = [f for f in files if re.fullmatch(r"(bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt", f)]
    fp32, model = {}, {}
    if layer_files:
        return _reference_pipeline(d, files, layer_files, optim)
    if z3_models:
        ms = [_load(os.path.join(d, f)) for f in z3_models]
        os_ = [_load(os.path.join(d, f))["optimizer_state_dict"] for f in optim]
        W = os_[0]["partition_count"]
        assert len(os_) == W == len(ms)
        m0 = ms[0]
        bn = m0["buffer_names"]
        for k, v in m0["module"].items():
            if k in bn:
                fp32[k] = v.float() if v.is_floating_point() else v.clone()
        frozen = {}
        for name, shape in (m0["frozen_param_shapes"] or {}).items():
            n = math.prod(shape)
            frozen[name] = torch.cat([m["frozen_param_fragments"][name] for m in ms])[:n].view(shape)
            fp32[name] = frozen[name].float()
        master = {}
        for i, shapes in enumerate(m0["param_shapes"]):
            off = 0
            for name, shape in shapes.items():
                n = math.prod(shape)
                p = math.ceil(n / W)
                master[name] = torch.cat([o["fp32_flat_groups"][i][off: off + p] for o in os_])[:n].view(shape)
                fp32[name] = master[name].clone()
                off += p
            assert off == os_[0]["fp32_flat_groups"][i].numel()
        for a, o in m0["shared_params"].items():
            fp32[a] = fp32[o].clone()
        for k, v in m0["module"].items():
            if k in bn:
                model[k] = v.clone()
            elif k in frozen:
                model[k] = frozen[k].clone()
            elif k in master:
                model[k] = master[k].to(v.dtype)
            else:
                model[k] = master[m0["shared_params"][k]].to(v.dtype)
        return fp32, model
    m0 = _load(os.path.join(d, "mp_rank_00_model_states.pt"))
    module = m0["module"]
    for k, v in module.items():
        model[k] = v.clone()
    if not optim and "fp32_groups" in (m0["optimizer"] or {}):
        return _reference_unfused(m0), model
    if not optim and "fp32_groups_flat" in (m0["optimizer"] or {}):
        return _reference_fused(m0), model
    if not optim:  # ZeRO-0 without BF16_Optimizer: serve module
        for k, v in module.items():
            fp32[k] = v.float() if v.is_floating_point() else v.clone()
        return fp32, model
    os_ = [_load(os.path.join(d, f))["optimizer_state_dict"] for f in optim]
    W = max(os_[0]["partition_count"])
    assert len(os_) == W
    bn = m0["buffer_names"]
    trainable = [n for g in m0["param_shapes"] for n in g]
    aliases = m0["shared_params"] or {}
    for k, v in module.items():
        if k in bn:
            fp32[k] = v.float() if v.is_floating_point() else v.clone()
    for k, v in module.items():
        if k not in bn and k not in trainable and k not in aliases:
            fp32[k] = v.float()
    for g, shapes in enumerate(m0["param_shapes"]):
        flat = torch.cat([o["single_partition_of_fp32_groups"][g] for o in os_])
        off = 0
        for name, shape in shapes.items():
            n = math.prod(shape)
            fp32[name] = flat[off: off + n].view(shape).clone()
            off += n
        assert math.ceil(off / (2 * W)) * 2 * W >= flat.numel() >= off
    for a, o in aliases.items():
        fp32[a] = fp32[o].clone()
    return fp32, model


def _module_params(m0):
    """(module, buffer names, param names in module order, {alias: owner}): an entry that is the same
    tensor (storage, offset, shape) as an earlier one is a tied alias."""
    module, bn = m0["module"], set(m0["buffer_names"])
    aliases, seen, params = {}, {}, []
    for k, v in module.items():
        if k in bn:
            continue
        key = (v.data_ptr(), tuple(v.shape), v.dtype)
        if key in seen:
            aliases[k] = seen[key]
        else:
            seen[key] = k
            params.append(k)
    return module, bn, params, aliases


def _zero0_fp32(module, bn, params, masters, aliases):
    """zero_to_fp32's order: buffers, frozen (params without a master), masters, aliases."""
    fp32 = {k: (v.float() if v.is_floating_point() else v.clone()) for k, v in module.items() if k in bn}
    fp32.update({k: module[k].float() for k in params if k not in masters})
    fp32.update(masters)
    fp32.update({a: masters[o].clone() for a, o in aliases.items()})
    return fp32


def _reference_fused(m0):
    """ZeRO-0 FP16_Optimizer: optimizer['fp32_groups_flat'][g] is group g's trainable params flattened; the
    module's params are views into the 16-bit flat buffer of that size, at their offset in the group."""
    module, bn, params, aliases = _module_params(m0)
    by_storage = {}
    for k in params:
        v = module[k]
        by_storage.setdefault(v.storage().data_ptr(), []).append(k)
    masters = {}
    for flat in m0["optimizer"]["fp32_groups_flat"]:
        owners = [ks for ks in by_storage.values() if module[ks[0]].storage().size() == flat.numel()]
        assert len(owners) == 1, f"{len(owners)} storages of {flat.numel()} elements"
        for k in sorted(owners[0], key=lambda k: module[k].storage_offset()):
            v = module[k]
            masters[k] = flat[v.storage_offset(): v.storage_offset() + v.numel()].view(v.shape).clone()
    return _zero0_fp32(module, bn, params, masters, aliases)


def _reference_unfused(m0):
    """ZeRO-0 FP16_UnfusedOptimizer: optimizer['fp32_groups'][g] holds the masters of group g's trainable
    params in module order; each group takes, by shape, the first params (not buffers, not tied repeats of
    an earlier entry's storage, not taken by an earlier group) in module order."""
    module, bn, params, aliases = _module_params(m0)
    masters, taken = {}, set()
    for group in m0["optimizer"]["fp32_groups"]:
        i = 0
        for t in group:
            while params[i] in taken or tuple(module[params[i]].shape) != tuple(t.shape):
                i += 1
            masters[params[i]] = t.clone()
            taken.add(params[i])
            i += 1
    return _zero0_fp32(module, bn, params, masters, aliases)


def _reference_pipeline(d, files, layer_files, optim):
    mp_files = [f for f in files if re.fullmatch(r"mp_rank_\d+_model_states\.pt", f)]
    model = {}
    mps = [_load(os.path.join(d, f)) for f in mp_files]
    bn = set(mps[0]["buffer_names"])
    layers = {}
    for f in layer_files:
        li = int(f.split("_")[1].split("-")[0])
        layers[li] = _load(os.path.join(d, f))
    # tied layer naming: a layer whose keys appear as tied_modules.<key>.* in param_shapes/buffer_names
    import universal_loader  # noqa: E402 (its DeepSpeed stand-ins unpickle fragment_address)
    # DeepSpeed >= 0.18.5 saves a ZeRO-0 BF16_Optimizer pipeline without param_shapes
    shapes_of = [m["param_shapes"] or universal_loader.slice_mapping_shapes(d, f) for m, f in zip(mps, mp_files)]
    all_names = set(bn) | {n for groups in shapes_of for g in groups for n in g}
    tied_prefix = {}
    for n in all_names:
        mt = re.match(r"(tied_modules\.[^.]+\.)(.*)", n)
        if mt:
            for li, sd in layers.items():
                if mt.group(2) in sd:
                    tied_prefix.setdefault(li, mt.group(1))
    for li in sorted(layers):
        pre = tied_prefix.get(li, f"{li}.")
        for k, v in layers[li].items():
            model[pre + k] = v.clone()
    fp32 = {}
    for k, v in model.items():
        if k in bn:
            fp32[k] = v.float() if v.is_floating_point() else v.clone()
    trainable = set(all_names) - bn
    for k, v in model.items():
        if k not in bn and k not in trainable:
            fp32[k] = v.float()
    for s in range(len(mps)):
        ranks = sorted([f for f in optim if f.endswith(f"_mp_rank_{s:02d}_optim_states.pt")], key=_natural_key)
        os_ = [_load(os.path.join(d, f))["optimizer_state_dict"] for f in ranks]
        for g, shapes in enumerate(shapes_of[s]):
            flat = torch.cat([o["single_partition_of_fp32_groups"][g] for o in os_])
            off = 0
            for name, shape in shapes.items():
                n = math.prod(shape)
                if name not in fp32:
                    fp32[name] = flat[off: off + n].view(shape).clone()
                off += n
    return fp32, model
