#!/usr/bin/python3
"""Writes synthetic Megatron-LM checkpoints (legacy ``--ckpt-format torch``: tracker,
``iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt`` [+ ``distrib_optim.pt``]) plus the merged outputs
ckptfs must show for them.

    /usr/bin/python3 mount_tests/gen_megatron/generate.py OUT_DIR [--only NAME ...] [--list] [--force]
                                                          [--no-torch-dist]

torch_dist cases are written by torch.distributed.checkpoint in the Debian 13 chroot
(${CKPTFS_CHROOT:-build/trixie}, torch 2.6) from per-rank plans made here (megatron_dist.py); without the
chroot they are skipped with a message on stderr.

Per case ``OUT_DIR/<case>/``: ``checkpoint/`` (the save dir), ``expected/`` (latest iteration;
``expected_<iter dir>/`` for older ones) with ``model.pt`` (OrderedDict merged name -> full tensor, training
dtype, padded vocab), ``fp32.pt`` (name -> fp32 master), for Llama/Qwen2-style and GPT-2-style cases ``hf.pt``
(HF name -> tensor), ``hf_config.json`` (the config.json fields ckptfs must write) and ``logits.json``
(megatron_forward.py's logits of a token batch), and ``case.json``.

Each case starts from a full random model (numpy, TP=1 PP=1 layout) that megatron_layout.py splits into the
rank files with its own implementation of every rule; megatron_check.py then reads the written files back
and merges them independently, and the case fails unless that gives the expectations again.  Nothing here
runs ckptfs.  Cases are written atomically (tmp dir + rename) and kept while case.json names GEN_VERSION.
"""
import argparse
import collections
import itertools
import json
import math
import os
import random
import shutil
import sys
import time
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))
import megatron_check  # noqa: E402
import megatron_dist  # noqa: E402
import megatron_forward  # noqa: E402
from case_cache import case_is_current, generation_lock  # noqa: E402
from megatron_args import DTYPE, make_args  # noqa: E402
from megatron_cases import all_cases, has_hf, hf_family, is_moe_layer, is_torch_dist, iter_dir_name  # noqa: E402
from megatron_layout import (EXTRA_TE, bucket_size, chunk_entries, chunk_layers, dims,  # noqa: E402
                             is_expert, merged_entries, pack_buffer, rule_of, split, tp_attrs)

OD = collections.OrderedDict
GEN_VERSION = 12  # bump to invalidate cached fixtures
CHECKPOINT_VERSION = 3.0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


# ----------------------------------------------------------------------------------------------------
# values

def components(case, rng):
    """fp32 master values of the model's pieces in Hugging Face terms (q, k, v, gate, up ...): the merged
    Megatron tensors and the HF tensors are both assembled from these."""
    d = dims(case)
    H, F, ng, hn, nq = d["H"], d["F"], d["ng"], d["hn"], d["np"]
    c = OD()

    def w(name, *shape, scale=None):
        """Random weights; matrices scaled by 1/sqrt(fan_in) so that every layer's outputs are O(1) (attention
        far from uniform, activations in their curved range: the logits depend on every detail of the
        forward pass), vectors (biases) 0.1."""
        scale = scale or (1.0 / math.sqrt(shape[-1]) if len(shape) == 2 else 0.1)
        c[name] = (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name, n=H):
        c[name] = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    ln_b = case["norm"] == "LayerNorm"
    w("emb", d["Vp"], H, scale=1.0)
    if case["pos"] == "learned_absolute":
        w("pos", case["max_pos"], H, scale=0.5)
    for g in range(d["L"]):
        p = f"L{g}."
        norm(p + "ln1.w")
        if ln_b:
            w(p + "ln1.b", H)
        w(p + "q", nq * hn, H)
        w(p + "k", ng * hn, H)
        w(p + "v", ng * hn, H)
        if case["qkv_bias"] or case["bias"]:
            w(p + "qb", nq * hn)
            w(p + "kb", ng * hn)
            w(p + "vb", ng * hn)
        w(p + "o", H, nq * hn)
        if case["bias"]:
            w(p + "ob", H)
        if case["qk_norm"]:
            norm(p + "qn", hn)
            norm(p + "kn", hn)
        norm(p + "ln2.w")
        if ln_b:
            w(p + "ln2.b", H)
        if is_moe_layer(case, g):
            w(p + "router", d["E"], H)
            if case["expert_bias"]:
                w(p + "router_bias", d["E"])
            for x in range(d["E"]):
                for part in (("gate", "up") if case["swiglu"] else ("fc1",)):
                    w(p + f"x{x}.{part}", d["Fe"], H)
                w(p + f"x{x}.down", H, d["Fe"])
            if case["shared_ffn"]:
                w(p + "shared.gate", case["shared_ffn"], H)
                w(p + "shared.up", case["shared_ffn"], H)
                w(p + "shared.down", H, case["shared_ffn"])
                if case["shared_gate"]:
                    w(p + "shared.gate_weight", 1, H)
            continue
        for part in (("gate", "up") if case["swiglu"] else ("fc1",)):
            w(p + part, F, H)
            if case["bias"]:
                w(p + part + "_b", F)
        w(p + "down", H, F)
        if case["bias"]:
            w(p + "down_b", H)
    norm("final.w")
    if ln_b:
        w("final.b", H)
    if not case["tied"]:
        w("out", d["Vp"], H)
    return c


def interleave_qkv(case, q, k, v):
    """Megatron's fused QKV rows: ng groups of [the group's q heads, k, v] (checkpoint_version >= 2)."""
    d = dims(case)
    rest = q.shape[1:]
    parts = [q.reshape((d["ng"], d["qpg"], d["hn"]) + rest), k.reshape((d["ng"], 1, d["hn"]) + rest),
             v.reshape((d["ng"], 1, d["hn"]) + rest)]
    return np.concatenate(parts, axis=1).reshape((-1,) + rest)


def assemble(case, c):
    """Canonical full (TP=1) Megatron tensors from the pieces; works on any element type."""
    full = OD()
    for k in ("emb", "pos", "final.w", "final.b", "out"):
        if k in c:
            full[k] = c[k]
    for g in range(case["layers"]):
        p = f"L{g}."
        for k in ("ln1.w", "ln1.b", "ln2.w", "ln2.b"):
            if p + k in c:
                full[p + k] = c[p + k]
        for k in ("qn", "kn"):
            if p + k in c:
                full[p + k + ".w"] = c[p + k]
        full[p + "qkv.w"] = interleave_qkv(case, c[p + "q"], c[p + "k"], c[p + "v"])
        if p + "qb" in c:
            full[p + "qkv.b"] = interleave_qkv(case, c[p + "qb"], c[p + "kb"], c[p + "vb"])
        full[p + "proj.w"] = c[p + "o"]
        if p + "ob" in c:
            full[p + "proj.b"] = c[p + "ob"]
        if is_moe_layer(case, g):
            full[p + "router.w"] = c[p + "router"]
            if p + "router_bias" in c:
                full[p + "router.eb"] = c[p + "router_bias"]
            for x in range(case["experts"]):
                q = p + f"x{x}."
                full[q + "fc1.w"] = np.concatenate([c[q + "gate"], c[q + "up"]]) if case["swiglu"] else c[q + "fc1"]
                full[q + "fc2.w"] = c[q + "down"]
            if p + "shared.gate" in c:
                full[p + "shared.fc1.w"] = np.concatenate([c[p + "shared.gate"], c[p + "shared.up"]])
                full[p + "shared.fc2.w"] = c[p + "shared.down"]
            if p + "shared.gate_weight" in c:
                full[p + "shared.gate.w"] = c[p + "shared.gate_weight"]
            continue
        if case["swiglu"]:
            full[p + "fc1.w"] = np.concatenate([c[p + "gate"], c[p + "up"]])
            if p + "gate_b" in c:
                full[p + "fc1.b"] = np.concatenate([c[p + "gate_b"], c[p + "up_b"]])
        else:
            full[p + "fc1.w"] = c[p + "fc1"]
            if p + "fc1_b" in c:
                full[p + "fc1.b"] = c[p + "fc1_b"]
        full[p + "fc2.w"] = c[p + "down"]
        if p + "down_b" in c:
            full[p + "fc2.b"] = c[p + "down_b"]
    return full


def cast(a, dtype):
    """fp32 array -> the training dtype's values: float32 itself, or the int16 bit patterns of torch's
    round-to-nearest-even bf16/fp16 cast."""
    if dtype == "fp32":
        return a.copy()
    return torch.from_numpy(np.ascontiguousarray(a)).to(DTYPE[dtype]).view(torch.int16).numpy().copy()


def stored_dtype(case, key):
    """The router's expert_bias is a float32 buffer whatever the training dtype (TopKRouter keeps it float32:
    _maintain_float32_expert_bias); everything else is stored in the training dtype."""
    return "fp32" if key.endswith(("router_bias", "router.eb")) else case["dtype"]


def to_torch(a, dtype):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype == "fp32" else t.view(DTYPE[dtype])


class Values:
    """One iteration's model: fp32 master pieces, the stored (training dtype) pieces, both assembled."""

    def __init__(self, case, seed):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.master_c = components(case, rng)
        dt = case["dtype"]
        assert not (case["stale"] and case["expert_bias"]), "a buffer has no master to lag behind"
        if case["stale"] and dt != "fp32":
            # the stored copy lags the master by more than rounding
            self.model_c = OD((k, cast(v - (rng.standard_normal(v.shape) * 0.01).astype(np.float32), dt))
                              for k, v in self.master_c.items())
        else:
            self.model_c = OD((k, cast(v, stored_dtype(case, k))) for k, v in self.master_c.items())
        self.master = assemble(case, self.master_c)
        self.model = assemble(case, self.model_c)


# ----------------------------------------------------------------------------------------------------
# pickled objects

class AttrTensor:
    """Pickles a tensor with Python attributes the way torch 2.x does (``torch._tensor._rebuild_from_type_v2``
    with the attribute dict): how Megatron's fp32 masters carry tensor_model_parallel & co."""

    def __init__(self, t, state):
        self.t, self.state = t, state

    def __reduce_ex__(self, proto):
        func, args = self.t._reduce_ex_internal(proto)
        return (torch._tensor._rebuild_from_type_v2, (func, torch.Tensor, args, self.state))


def param_group(decay, with_params=None, step=None, expert=False):
    g = {"is_expert_parallel": expert, "default_config": True, "wd_mult": 1.0 if decay else 0.0, "lr_mult": 1.0,
         "is_decoupled_lr": False, "max_lr": 0.01, "min_lr": 0.001, "lr": 0.008145033635316129,
         "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.01 if decay else 0.0, "amsgrad": False,
         "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
         "decoupled_weight_decay": True}
    if with_params is not None:
        g["params"] = with_params
    if step is not None:
        g["step"] = step
    return g


def rng_state(seed):
    gen = torch.Generator()
    gen.manual_seed(seed)
    small = torch.from_numpy(np.frombuffer(seed.to_bytes(16, "little"), dtype=np.uint8).copy())
    return [{"random_rng_state": random.Random(seed).getstate(),
             "np_rng_state": np.random.RandomState(seed % 2 ** 32).get_state(),
             "torch_rng_state": gen.get_state(), "cuda_rng_state": small.clone(),
             "rng_tracker_states": {"data-parallel-rng": small.clone(), "model-parallel-rng": small.clone(),
                                    "expert-parallel-rng": small.clone()}}]


def scheduler_state(iteration):
    return {"max_lr": 0.01, "lr_warmup_steps": 0, "num_steps": 2 * iteration, "lr_decay_style": "cosine",
            "lr_decay_steps": 20, "min_lr": 0.001, "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
            "wd_incr_steps": 20}


def grad_scaler(case):
    if case["dtype"] != "fp16":
        return {}
    return {"grad_scaler": {"scale": torch.tensor(65536.0), "growth_tracker": 1, "hysteresis_tracker": 2}}


def adam_moments(rng, shape):
    return ((rng.standard_normal(shape) * 1e-3).astype(np.float32),
            (np.abs(rng.standard_normal(shape)) * 1e-6).astype(np.float32))


def garbage(rng, n):
    """Random fp32 bit patterns (NaN, inf included): what alignment gaps hold."""
    return rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


# ----------------------------------------------------------------------------------------------------
# one rank file

def extra_value(kind):
    return torch.empty(0, dtype=torch.uint8) if kind == EXTRA_TE else None


def nest(entries, values):
    """Model dict from entries: flat OrderedDict (core) or nested dicts (legacy; module state dicts, the
    innermost level, are OrderedDicts)."""
    root = OD() if len(entries[0].path) == 1 else {}
    for e, v in zip(entries, values):
        node = root
        for i, k in enumerate(e.path[:-1]):
            leaf = i == len(e.path) - 2
            node = node.setdefault(k, OD() if leaf else {})
        node[e.path[-1]] = v
    return root


def rank_params(case, vals, t, p, ep=0):
    """The parameters of TP rank t, PP rank p, EP rank ep, per model chunk in named_parameters order:
    [[(entry, master shard, shared embedding)]]."""
    layers = chunk_layers(case)
    params = []
    for v in range(case["vp"]):
        pre, post = p == 0 and v == 0, p == case["pp"] - 1 and v == case["vp"] - 1
        params.append([(e, split(case, rule_of(case, e.src), vals.master[e.src], t),
                        case["tied"] and case["pp"] > 1 and e.src == "emb")
                       for e in chunk_entries(case, layers[(p, v)], pre, post, ep_rank=ep)
                       if e.is_param and not e.buffer])
    return params


def write_rank(case, vals, iteration, t, p, rank_dir, seed, ep=0):
    """Writes mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt (and distrib_optim.pt) of TP rank t, PP rank p, EP
    rank ep."""
    dt = case["dtype"]
    rng = np.random.default_rng(seed)
    layers = chunk_layers(case)
    state = OD()
    state["args"] = make_args(case, iteration)
    state["checkpoint_version"] = CHECKPOINT_VERSION
    state["iteration"] = 0 if iteration == "release" else iteration
    params = rank_params(case, vals, t, p, ep)
    for v in range(case["vp"]):
        entries = chunk_entries(case, layers[(p, v)], p == 0 and v == 0, p == case["pp"] - 1 and v == case["vp"] - 1,
                                ep_rank=ep)
        values = [to_torch(split(case, rule_of(case, e.src), vals.model[e.src], t), stored_dtype(case, e.src))
                  if e.is_param
                  else extra_value(e.extra) for e in entries]
        state["model" if case["vp"] == 1 else f"model{v}"] = nest(entries, values)
    if case["optimizer"]:
        state["optimizer"] = optimizer_state(case, params, rng, iteration)
        state["opt_param_scheduler"] = scheduler_state(state["iteration"])
        state["rng_state"] = rng_state(seed)
    state["num_floating_point_operations_so_far"] = 123456789 * (state["iteration"] + 1)
    os.makedirs(rank_dir)
    torch.save(state, os.path.join(rank_dir, "model_optim_rng.pt"))
    if case["optimizer"] and case["dist_opt"]:
        torch.save(distrib_optim_state(case, params, rng, p, ep), os.path.join(rank_dir, "distrib_optim.pt"))


def optimizer_state(case, params, rng, iteration, expert_optimizer=None):
    """The ``optimizer`` entry: FP32Optimizer (fp32), Float16OptimizerWithFloat16Params (bf16/fp16) or
    DistributedOptimizer (state in distrib_optim.pt).  Param groups: 0 = 2-D weights, 1 = 1-D (norms,
    biases), each in named_parameters order over the model chunks; only the non-empty ones (Megatron makes a
    group per key that has params: an expert optimizer over 2-D expert weights has one).  MoE: a list of
    two (dense, expert), ``expert_optimizer`` says which one this is."""
    flat = [(e, m) for chunk in params for e, m, _ in chunk]
    if case["experts"] and expert_optimizer is None:
        # ChainedOptimizer: [dense optimizer, expert optimizer], each over its own params
        return [optimizer_state(case, expert_params(params, exp), rng, iteration, exp) for exp in (False, True)]
    groups = [[x for x in flat if x[1].ndim >= 2], [x for x in flat if x[1].ndim == 1]]
    step = float(iteration if iteration != "release" else 1)
    if expert_optimizer is not None:
        groups = [g for g in groups if g]
    if case["dist_opt"]:
        return {"optimizer": {"param_groups": [param_group(grp[0][1].ndim >= 2 if grp else g == 0, step=int(step),
                                                           expert=bool(expert_optimizer))
                                               for g, grp in enumerate(groups)]},
                **grad_scaler(case)}
    state, idx, i = {}, [], 0
    for grp in groups:
        idx.append(list(range(i, i + len(grp))))
        for e, m in grp:
            ea, eas = adam_moments(rng, m.shape)
            state[i] = {"step": torch.tensor(step), "exp_avg": torch.from_numpy(ea),
                        "exp_avg_sq": torch.from_numpy(eas)}
            i += 1
    inner = {"state": state, "param_groups": [param_group(grp[0][1].ndim >= 2 if grp else g == 0, with_params=idx[g],
                                                          expert=bool(expert_optimizer))
                                              for g, grp in enumerate(groups)]}
    if case["dtype"] == "fp32":
        return inner
    masters = [[AttrTensor(torch.from_numpy(m), tp_attrs(rule_of(case, e.src), is_expert(e.src))) for e, m in grp]
               for grp in groups]
    return {"optimizer": inner, **grad_scaler(case), "fp32_from_fp16_params": masters}


def expert_params(params, expert):
    """The per-chunk params [[(entry, master, shared)]] of the dense (``expert`` False) or the expert optimizer."""
    return [[x for x in chunk if is_expert(x[0].src) == expert] for chunk in params]


def distrib_optim_state(case, params, rng, p, ep=0):
    """distrib_optim.pt of PP rank ``p``, EP rank ``ep``.  MoE: the ChainedOptimizer's LIST [dense state, expert
    state], each a coalesced dict of buffers over its own params (one buffer per model chunk); the dense entry is
    None unless ``ep`` is 0 (the rank saving EP rank ep's dir is dense DP rank 0 only for ep 0: Megatron's
    ChainedOptimizer.save_parameter_state appends None for an optimizer whose DP rank is not 0)."""
    if case["experts"]:
        assert case["distopt_layout"] == "coalesced" and not case["overlap_grad_reduce"], "MoE: coalesced, one bucket"
        return [_distrib_optim_dict(case, expert_params(params, False), rng, p) if ep == 0 else None,
                _distrib_optim_dict(case, expert_params(params, True), rng, p)]
    return _distrib_optim_dict(case, params, rng, p)


def _distrib_optim_dict(case, params, rng, p):
    """One distributed optimizer's state: one buffer per model chunk, in the layout of the case's era
    (``distopt_layout``, megatron_cases.py): coalesced (core >= 0.7; with overlap_grad_reduce its buckets
    concatenated without their end padding), a list of buckets (core 0.6) or one padded buffer (2023-05)."""
    layout, dp = case["distopt_layout"], case["dp"]
    assert layout != "padded" or not case["overlap_grad_reduce"], "2023 layout: one bucket per buffer only"
    if layout == "coalesced":
        out, key = {"buckets_coalesced": True}, (DTYPE[case["dtype"]], torch.float32)
    elif layout == "buckets":
        out, key = {"per_bucket_numel": [], "per_bucket_numel_unpadded": []}, (DTYPE[case["dtype"]], torch.float32)
    else:
        assert layout == "padded", layout
        out, key = {}, torch.float32
    for v, chunk in enumerate(params):
        moments = [adam_moments(rng, m.shape) for _, m, _ in chunk]
        bufs = {}
        for name, arrays in (("param", [m for _, m, _ in chunk]), ("exp_avg", [a for a, _ in moments]),
                             ("exp_avg_sq", [b for _, b in moments])):
            flat, _, total, buckets = pack_buffer([(a, s) for a, (_, _, s) in zip(arrays, chunk)],
                                                  lambda n: garbage(rng, n).copy(), dp,
                                                  aligned=layout == "coalesced",
                                                  bucket_size=bucket_size(case, p, v))
            if layout == "coalesced":
                bufs[name] = torch.from_numpy(flat)
                continue
            # older layouts: each bucket (2023: the one buffer) padded at its end to a multiple of DP, garbage
            # in the padding (torch.empty)
            padded = [-(-u // dp) * dp for u in buckets]
            assert any(n > u for n, u in zip(padded, buckets)), f"{case['name']}: no end padding ({buckets}, DP {dp})"
            parts, start = [], 0
            for u, n in zip(buckets, padded):
                parts.append(torch.from_numpy(np.concatenate([flat[start:start + u], garbage(rng, n - u)])))
                start += u
            if layout == "padded":
                (bufs[name],) = parts
            else:
                bufs[name] = parts
        if layout == "coalesced":
            bufs["numel_unpadded"] = total
        elif layout == "buckets":
            out["per_bucket_numel"].append({key: padded})
            out["per_bucket_numel_unpadded"].append({key: buckets})
        out[v] = {key: bufs}
    return out


# ----------------------------------------------------------------------------------------------------
# expectations

def expected_model(case, vals):
    names = [e for e in merged_entries(case) if e.is_param and not e.copy]
    model = OD((e.name, to_torch(vals.model[e.src], stored_dtype(case, e.src)).clone()) for e in names)
    fp32 = OD((e.name, torch.from_numpy(vals.master[e.src].copy())) for e in names)
    return model, fp32


def expected_hf(case, vals):
    """The Hugging Face state dict from the stored pieces (vocab trimmed to the true vocab), training dtype."""
    hf = (_hf_gpt2 if hf_family(case) == "gpt2" else _hf_llama)(case, vals.model_c, case["vocab"])
    return OD((k, to_torch(v, case["dtype"]).clone()) for k, v in hf.items())


def _hf_gpt2(case, c, V):
    """GPT2LMHeadModel: Conv1D weights stored [in, out] (transposed), c_attn = [all q; all k; all v]."""
    hf = OD()
    hf["transformer.wte.weight"] = c["emb"][:V]
    hf["transformer.wpe.weight"] = c["pos"]
    for g in range(case["layers"]):
        p, q = f"L{g}.", f"transformer.h.{g}."
        hf[q + "ln_1.weight"], hf[q + "ln_1.bias"] = c[p + "ln1.w"], c[p + "ln1.b"]
        hf[q + "attn.c_attn.weight"] = np.concatenate([c[p + "q"], c[p + "k"], c[p + "v"]]).T
        hf[q + "attn.c_attn.bias"] = np.concatenate([c[p + "qb"], c[p + "kb"], c[p + "vb"]])
        hf[q + "attn.c_proj.weight"], hf[q + "attn.c_proj.bias"] = c[p + "o"].T, c[p + "ob"]
        hf[q + "ln_2.weight"], hf[q + "ln_2.bias"] = c[p + "ln2.w"], c[p + "ln2.b"]
        hf[q + "mlp.c_fc.weight"], hf[q + "mlp.c_fc.bias"] = c[p + "fc1"].T, c[p + "fc1_b"]
        hf[q + "mlp.c_proj.weight"], hf[q + "mlp.c_proj.bias"] = c[p + "down"].T, c[p + "down_b"]
    hf["transformer.ln_f.weight"], hf["transformer.ln_f.bias"] = c["final.w"], c["final.b"]
    if not case["tied"]:
        hf["lm_head.weight"] = c["out"][:V]
    return hf


# How Qwen3-MoE and Mixtral checkpoints name a sparse block's router and expert x's projections
HF_MOE_NAMES = {
    "qwen2_moe": ("mlp.gate.weight", "mlp.experts.{x}.gate_proj.weight", "mlp.experts.{x}.up_proj.weight",
                  "mlp.experts.{x}.down_proj.weight"),
    "qwen3_moe": ("mlp.gate.weight", "mlp.experts.{x}.gate_proj.weight", "mlp.experts.{x}.up_proj.weight",
                  "mlp.experts.{x}.down_proj.weight"),
    "mixtral": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{x}.w1.weight",
                "block_sparse_moe.experts.{x}.w3.weight", "block_sparse_moe.experts.{x}.w2.weight"),
}


def _hf_llama(case, c, V):
    """LlamaForCausalLM (Qwen2ForCausalLM: q/k/v biases), Qwen3MoeForCausalLM (q/k norms, sparse blocks and
    dense MLPs), Qwen2MoeForCausalLM (the same with a gated shared expert), MixtralForCausalLM
    (block_sparse_moe)."""
    hf = OD()
    hf["model.embed_tokens.weight"] = c["emb"][:V]
    for g in range(case["layers"]):
        p, q = f"L{g}.", f"model.layers.{g}."
        hf[q + "input_layernorm.weight"] = c[p + "ln1.w"]
        for x in ("q", "k", "v"):
            hf[q + f"self_attn.{x}_proj.weight"] = c[p + x]
            if p + x + "b" in c:
                hf[q + f"self_attn.{x}_proj.bias"] = c[p + x + "b"]
        hf[q + "self_attn.o_proj.weight"] = c[p + "o"]
        if case["qk_norm"]:
            hf[q + "self_attn.q_norm.weight"], hf[q + "self_attn.k_norm.weight"] = c[p + "qn"], c[p + "kn"]
        hf[q + "post_attention_layernorm.weight"] = c[p + "ln2.w"]
        if is_moe_layer(case, g):
            router, gate, up, down = HF_MOE_NAMES[hf_family(case)]
            hf[q + router] = c[p + "router"]
            for x in range(case["experts"]):
                for name, part in ((gate, "gate"), (up, "up"), (down, "down")):
                    hf[q + name.format(x=x)] = c[p + f"x{x}.{part}"]
            if case["shared_ffn"]:  # Qwen2-MoE's shared expert and its gate
                for part in ("gate", "up", "down"):
                    hf[q + f"mlp.shared_expert.{part}_proj.weight"] = c[p + f"shared.{part}"]
                hf[q + "mlp.shared_expert_gate.weight"] = c[p + "shared.gate_weight"]
            continue
        hf[q + "mlp.gate_proj.weight"] = c[p + "gate"]
        hf[q + "mlp.up_proj.weight"] = c[p + "up"]
        hf[q + "mlp.down_proj.weight"] = c[p + "down"]
    hf["model.norm.weight"] = c["final.w"]
    if not case["tied"]:
        hf["lm_head.weight"] = c["out"][:V]
    return hf


def expected_hf_config(case):
    d = dims(case)
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[case["dtype"]]
    common = {"vocab_size": d["V"], "tie_word_embeddings": case["tied"], "torch_dtype": dtype, "dtype": dtype,
              "initializer_range": 0.02}
    if hf_family(case) == "gpt2":
        # Megatron's tanh-approximated GeLUs (bias_gelu_fusion's bias_gelu, openai_gelu) are HF's gelu_new
        # (gelu_fast / gelu_pytorch_tanh compute the same); F.gelu is the erf one
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": d["H"], "n_layer": d["L"],
                "n_head": d["np"], "n_positions": case["max_pos"], "n_inner": None if d["F"] == 4 * d["H"] else d["F"],
                "activation_function": "gelu" if case["act"] == "gelu" else "gelu_new",
                "layer_norm_epsilon": 1e-05, **common}
    theta = case["rotary_base"]
    # biases on q/k/v only (add_qkv_bias without add_bias_linear) is Qwen2: Llama's attention_bias would
    # also give o_proj a bias that the Megatron model does not have
    qwen2 = case["qkv_bias"] and not case["bias"]
    cfg = {"architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
           "model_type": "qwen2" if qwen2 else "llama", "hidden_size": d["H"],
           "intermediate_size": d["F"], "num_attention_heads": d["np"], "num_key_value_heads": d["ng"],
           "head_dim": d["hn"], "num_hidden_layers": d["L"], "rms_norm_eps": 1e-05, "rope_theta": theta,
           "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
           "max_position_embeddings": case["max_pos"], "attention_bias": case["qkv_bias"] or case["bias"],
           "hidden_act": "silu", **common}
    moe = hf_family(case) in ("qwen2_moe", "qwen3_moe", "mixtral")
    if not qwen2 and not moe:
        cfg["mlp_bias"] = case["bias"]
    if moe:
        # Qwen3MoeConfig and MixtralConfig fields (Mixtral's intermediate_size is an expert's)
        cfg.update(num_local_experts=d["E"], num_experts_per_tok=case["topk"], router_aux_loss_coef=0.01,
                   output_router_logits=False)
    if hf_family(case) in ("qwen2_moe", "qwen3_moe"):
        cfg.update(moe_intermediate_size=d["Fe"], norm_topk_prob=not case["pre_softmax"], decoder_sparse_step=1,
                   mlp_only_layers=[g for g in range(d["L"]) if not is_moe_layer(case, g)], use_sliding_window=False,
                   sliding_window=None, max_window_layers=d["L"])
    if hf_family(case) == "qwen3_moe":
        cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")
    elif hf_family(case) == "qwen2_moe":
        # Qwen2MoeConfig: q/k/v biases as qkv_bias, the experts as num_experts (no attention_bias field)
        cfg.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", qkv_bias=case["qkv_bias"],
                   num_experts=cfg.pop("num_local_experts"), shared_expert_intermediate_size=case["shared_ffn"])
        del cfg["attention_bias"]
    elif hf_family(case) == "mixtral":
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=d["Fe"],
                   sliding_window=None, router_jitter_noise=0.0)
        del cfg["attention_bias"]
    return cfg


LOGITS_SEQ, LOGITS_BATCH = 12, 2
# transformers in float32 on the same (upcast) weights vs. this float64 pass differ by float32 rounding only:
# about 3e-7 of the largest logit here; the tolerance is 5e-6 of it (Megatron's tanh vs. erf GeLU moves the
# logits of these models by 1.5e-4 of it)
LOGITS_RTOL_OF_MAX = 5e-6


def expected_logits(case, vals, iteration, seed):
    """logits.json: a token batch and the logits of megatron_forward's float64 pass over the merged Megatron
    tensors as stored (training dtype, upcast exactly), true vocab.  Raises unless a wrong activation
    flavour or rotary base would move the logits by far more than the tolerance (the check has teeth)."""
    args = make_args(case, iteration)
    full = OD((k, megatron_forward.stored_values(v, case["dtype"])) for k, v in vals.model.items())
    seq = min(LOGITS_SEQ, case["max_pos"])
    tokens = np.random.default_rng(seed).integers(0, case["vocab"], size=(LOGITS_BATCH, seq))
    out = megatron_forward.logits(args, full, tokens)
    assert out.shape == (LOGITS_BATCH, seq, case["vocab"]) and np.isfinite(out).all()
    if hf_family(case) == "gpt2":
        other = megatron_forward.logits(args, full, tokens, act="gelu" if case["act"] != "gelu" else "fused_gelu")
    elif case["experts"]:  # the other router normalisation (Qwen3-MoE's norm_topk_prob)
        other = megatron_forward.logits(args, full, tokens, pre_softmax=not case["pre_softmax"])
    else:
        args.rotary_base *= 2
        other = megatron_forward.logits(args, full, tokens)
    sensitivity = float(np.abs(other - out).max())
    atol = LOGITS_RTOL_OF_MAX * max(1.0, float(np.abs(out).max()))
    assert sensitivity > 10 * atol, f"{case['name']}: logits barely depend on the variant ({sensitivity}, atol {atol})"
    return {"tokens": tokens.tolist(), "logits": out.astype(np.float32).tolist(), "atol": atol,
            "activation": megatron_forward.activation_of(make_args(case, iteration)),
            "max_abs_logit": float(np.abs(out).max()), "variant_max_abs_diff": sensitivity,
            "note": "float64 forward of the unsplit Megatron model (megatron_forward.py), weights as stored"}


def rank_dir_name(case, t, p, ep=0):
    return "mp_rank_%02d" % t + ("_%03d" % p if case["pp"] > 1 else "") + ("_%03d" % ep if case["ep"] > 1 else "")


def write_tokenizer(save_dir, case):
    with open(os.path.join(save_dir, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "WordLevel", "unk_token": "<unk>",
                                               "vocab": {f"t{i}": i for i in range(case["vocab"])}}}, f)
    with open(os.path.join(save_dir, "tokenizer_config.json"), "wb") as f:
        f.write('{\n  "tokenizer_class": "PreTrainedTokenizerFast",\n  "model_max_length": 64,\n'
                '  "unk_token": "<unk>",\n  "note": "caf\u00e9 \u2713"\n}\n'.encode("utf-8"))


def generate_case(case, root):
    t0 = time.time()
    save_dir = os.path.join(root, "checkpoint")
    os.makedirs(save_dir)
    expected_dirs, tags = {}, []
    for n, it in enumerate(case["iterations"]):
        tag = iter_dir_name(it)
        tags.append(tag)
        seed = zlib.crc32(f"{case['name']}/{tag}".encode())
        vals = Values(case, seed)
        if is_torch_dist(case):
            megatron_dist.write_plans(case, vals, it, os.path.join(save_dir, tag), seed, sys.modules[__name__])
        else:
            for p, t, ep in itertools.product(range(case["pp"]), range(case["tp"]), range(case["ep"])):
                write_rank(case, vals, it, t, p, os.path.join(save_dir, tag, rank_dir_name(case, t, p, ep)),
                           seed + 1 + (ep * case["pp"] + p) * case["tp"] + t, ep)
        exp = "expected" if n == len(case["iterations"]) - 1 else f"expected_{tag}"
        os.makedirs(os.path.join(root, exp))
        model, fp32 = expected_model(case, vals)
        torch.save(model, os.path.join(root, exp, "model.pt"))
        torch.save(fp32, os.path.join(root, exp, "fp32.pt"))
        hf = None
        if has_hf(case):
            hf = expected_hf(case, vals)
            torch.save(hf, os.path.join(root, exp, "hf.pt"))
            with open(os.path.join(root, exp, "hf_config.json"), "w") as f:
                json.dump(expected_hf_config(case), f, indent=1)
            with open(os.path.join(root, exp, "logits.json"), "w") as f:
                json.dump(expected_logits(case, vals, it, seed), f)
        if not is_torch_dist(case):  # torch_dist: checked once the chroot wrote it (finish_dist_cases): merge the files just written with an independent reader
            # the self-check: merge the files just written with an independent reader
            megatron_check.check(os.path.join(save_dir, tag), model, fp32, hf)
        expected_dirs[tag] = exp
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(case["iterations"][-1]))  # Megatron writes no newline
    if case["tokenizer"]:
        write_tokenizer(save_dir, case)
    info = dict(case)
    info.update(src="checkpoint", tags=tags, latest=tags[-1], expected=expected_dirs,
                hf=has_hf(case), hf_family=hf_family(case), tokenizer_files=list(TOKENIZER_FILES) if case["tokenizer"] else [],
                rank_dirs=sorted(os.listdir(os.path.join(save_dir, tags[-1]))), dims=dims(case),
                generator_version=GEN_VERSION, generate_seconds=round(time.time() - t0, 2))
    # torch_dist: case.json appears when the chroot has written the DCP files and the check passed
    with open(os.path.join(root, "case.json.pending" if is_torch_dist(case) else "case.json"), "w") as f:
        json.dump(info, f, indent=1)


def check_dist(iter_dir, args, model, fp32, exp_dir):
    """The torch_dist self-check (megatron_dist.finish): the DCP read back and unstacked vs. expected/."""
    hf_path = os.path.join(exp_dir, "hf.pt")
    hf = torch.load(hf_path) if os.path.exists(hf_path) else None
    megatron_check.compare(iter_dir, args, model, fp32, torch.load(os.path.join(exp_dir, "model.pt")),
                           torch.load(os.path.join(exp_dir, "fp32.pt")), hf)


def write_cases_atomically(out_dir, cases, force):
    """Returns the names (re)written; current cases are kept unless ``force``.  torch_dist cases are
    skipped with a message when the chroot is missing."""
    todo = [c for c in cases if force or not case_is_current(os.path.join(out_dir, c["name"]), GEN_VERSION)]
    dist = [c for c in todo if is_torch_dist(c)]
    chroot, why = megatron_dist.chroot_status()
    if dist and why:
        print(f"generate.py: skipping the torch_dist case(s) {', '.join(c['name'] for c in dist)}: {why}",
              file=sys.stderr)
        todo = [c for c in todo if not is_torch_dist(c)]
        dist = []
    tmps = {c["name"]: os.path.join(out_dir, f".tmp-{c['name']}-{os.getpid()}") for c in todo}
    try:
        for c in todo:
            shutil.rmtree(tmps[c["name"]], ignore_errors=True)
            os.makedirs(tmps[c["name"]])
            generate_case(c, tmps[c["name"]])
        if dist:
            megatron_dist.write_dcp([tmps[c["name"]] for c in dist], chroot)
            for c in dist:
                megatron_dist.finish(tmps[c["name"]], check_dist)
        for c in todo:
            final = os.path.join(out_dir, c["name"])
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmps[c["name"]], final)
    finally:
        for t in tmps.values():
            shutil.rmtree(t, ignore_errors=True)
    return [c["name"] for c in todo]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="generate only these cases")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--force", action="store_true", help="regenerate cases that exist")
    ap.add_argument("--no-torch-dist", action="store_true", help="leave out the torch_dist cases (they need the chroot)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cases = {c["name"]: c for c in all_cases()}
    if args.list:
        print("\n".join(cases))
        return 0
    unknown = [n for n in args.only or [] if n not in cases]
    if unknown:
        ap.error(f"unknown case(s): {', '.join(unknown)}")
    os.makedirs(args.out_dir, exist_ok=True)
    t0 = time.time()
    todo = [cases[n] for n in (args.only or cases) if not (args.no_torch_dist and is_torch_dist(cases[n]))]
    with generation_lock(args.out_dir):  # one generator at a time per folder (pytest-xdist workers)
        made = len(write_cases_atomically(args.out_dir, todo, args.force))
    print(f"generated {made} Megatron case(s) in {time.time() - t0:.1f}s into {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
