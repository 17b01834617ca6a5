#!/usr/bin/python3
"""Writes synthetic DeepSpeed checkpoints (real ``torch.save`` zip files with DeepSpeed's pickled class
names and storage sharing) plus the merged outputs ckptfs must produce from them.

    /usr/bin/python3 mount_tests/gen/generate.py OUT_DIR [--only NAME ...] [--list] [--force]

For every case: ``OUT_DIR/<case>/checkpoint/`` (a DeepSpeed save dir: ``latest`` + ``<tag>/``),
``OUT_DIR/<case>/expected/{fp32.pt,model.pt}`` (``torch.save``d plain dicts name -> tensor, in the
order ckptfs serves them) and ``OUT_DIR/<case>/case.json``.  For a tag with partitioned optimizer
state (ZeRO-1/2/3, BF16_Optimizer, pipeline) also ``universal.pt`` (OrderedDict param name -> {'fp32',
'exp_avg', 'exp_avg_sq'[, 'step']}: what ckptfs must serve under universal/<tag>_universal/zero/<name>/)
and ``universal_optimizer_state.pt`` (its zero/optimizer_state.pt); case.json ``universal`` gives the
file form ('dict' / 'bare'), the model-state files copied, the file count (tensor-parallel cases:
also ``merge_keys``, the keys each param's dict holds before 'param').  Cases are written
atomically (tmp dir + rename) and skipped when already present.  Everything is seeded; the
expectations are computed from the generated master values with torch, never by running ckptfs.

Layouts follow docs/formats/deepspeed.md and the real DeepSpeed 0.14.5 fixtures in
mount_tests/fixtures/deepspeed-real (same keys, key order, class names, file names).
"""
import argparse
import collections
import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import deepspeed_classes  # noqa: E402
from case_cache import case_is_current, generation_lock  # noqa: E402
from llama_layout import llama_tensors  # noqa: E402
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gen_prefixes"))
from lightning_state import ckpt_path as lightning_ckpt_path, lightning_state  # noqa: E402
from tp_slicing import tp_cols, tp_gated_rows, tp_rows  # noqa: E402

DS = deepspeed_classes.install()
OD = collections.OrderedDict
DS_VERSION = "0.14.5"
GEN_VERSION = 8  # bump to invalidate cached fixtures

VOCAB, HIDDEN, FFN, SEQ = 101, 37, 53, 7
MANY_PARAMS = 20480  # trainable params of many_params_z2_dp2
MANY_PARAMS_100K = 100_000  # trainable params of many_params_100k_z2_dp2 (bench/scale_bench.sh)
SCALE_RANKS = (8, 64, 512)  # scale_z3_dp<N> for bench/scale_bench.sh, next to scale_z3_dp1024
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------------
# model description

class Entry:
    """One ``module`` (state_dict) entry."""

    def __init__(self, name, kind, shape=None, group=None, subgroup=None, btype=None, owner=None):
        self.name, self.kind, self.shape = name, kind, tuple(shape) if shape is not None else None
        self.group, self.subgroup, self.btype, self.owner = group, subgroup, btype, owner

    @property
    def numel(self):
        return int(np.prod(self.shape)) if self.shape else 1


def tiny_lm():
    """TinyLM of the real fixtures plus: 2 param groups (decay / no-decay), a second frozen parameter in
    the middle of the module, an int64 buffer with values > 2**24 and a bool buffer.  ZeRO-3 splits the
    decay group in two sub-groups.  Returns entries in state_dict (module) order."""
    E = []
    E.append(Entry("pos", "frozen", (SEQ, HIDDEN)))
    E.append(Entry("out_bias", "train", (VOCAB,), group=1, subgroup=2))
    # fewer elements than DP ranks: with DP 8 ranks 3..7 hold only padding of it under ZeRO-3
    E.append(Entry("logit_scale", "train", (3,), group=1, subgroup=2))
    E.append(Entry("mix", "buffer", (HIDDEN,), btype="float"))
    E.append(Entry("step_count", "buffer", (3,), btype="int64"))
    E.append(Entry("embed.weight", "train", (VOCAB, HIDDEN), group=0, subgroup=0))
    for b in range(2):
        p = f"blocks.{b}."
        if b == 1:
            E.append(Entry(p + "mask", "buffer", (5,), btype="bool"))
        E.append(Entry(p + "ln.weight", "train", (HIDDEN,), group=1, subgroup=2))
        if b == 1:
            E.append(Entry(p + "ln.bias", "frozen", (HIDDEN,)))
        else:
            E.append(Entry(p + "ln.bias", "train", (HIDDEN,), group=1, subgroup=2))
        E.append(Entry(p + "fc1.weight", "train", (FFN, HIDDEN), group=0, subgroup=b))
        E.append(Entry(p + "fc1.bias", "train", (FFN,), group=1, subgroup=2))
        E.append(Entry(p + "fc2.weight", "train", (HIDDEN, FFN), group=0, subgroup=b))
        E.append(Entry(p + "fc2.bias", "train", (HIDDEN,), group=1, subgroup=2))
    E.append(Entry("ln_f.weight", "train", (HIDDEN,), group=1, subgroup=2))
    E.append(Entry("ln_f.bias", "train", (HIDDEN,), group=1, subgroup=2))
    E.append(Entry("head.weight", "alias", (VOCAB, HIDDEN), owner="embed.weight"))
    return E


def tiny_lm_unfused():
    """tiny_lm with its frozen parameter of block 1 moved from ln.bias (a twin of the trainable ln.weight: a
    ZeRO-0 FP16_UnfusedOptimizer file, naming no master, cannot tell them apart) to fc1.bias."""
    E = tiny_lm()
    for e in E:
        if e.name == "blocks.1.ln.bias":
            e.kind, e.group, e.subgroup = "train", 1, 2
        elif e.name == "blocks.1.fc1.bias":
            e.kind, e.group, e.subgroup = "frozen", None, None
    return E


# Llama-shaped case: a tiny LlamaForCausalLM with Hugging Face's parameter names, so that
# transformers.AutoModelForCausalLM.from_pretrained can load the mount (mount_tests/device/).
LLAMA = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-05, "rope_theta": 10000.0}


def llama_entries():
    """LlamaForCausalLM's state_dict (untied lm_head, no biases, no persistent buffers).  Param groups as
    HF's Trainer makes them: decay = the matrices, no-decay = the norms; ZeRO-3 sub-groups: embedding +
    layer 0, layer 1 + lm_head, norms."""
    hd = LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
    groups = {"embed": (0, 0), "head": (0, 1), "norm": (1, 2)}
    return [Entry(name, "train", shape, *(groups.get(role) or (0, min(layer, 1))))
            for name, shape, role, layer in llama_tensors("hf", LLAMA["hidden_size"], hd * LLAMA["num_key_value_heads"],
                                                          LLAMA["intermediate_size"], LLAMA["vocab_size"],
                                                          LLAMA["num_hidden_layers"])]


def many_params_entries(n_train=MANY_PARAMS):
    """``n_train`` small trainable params (shapes cycle through 1-D, 2-D and one-element ones) in two
    param groups, plus a frozen param, a float buffer and a tied alias: many universal/zero/<param>/
    folders from a small checkpoint."""
    shapes = [(3,), (2, 3), (1,), (5,), (2, 2), (7,), (1, 1)]
    E = [Entry("pos", "frozen", (4, 3)), Entry("mix", "buffer", (3,), btype="float")]
    for i in range(n_train):
        E.append(Entry(f"blocks.{i // 4}.p{i % 4}", "train", shapes[i % len(shapes)], group=i % 3 // 2,
                       subgroup=0))
    E.append(Entry("head.weight", "alias", (2, 3), owner="blocks.0.p1"))
    return E


def wrapped_llama_entries(case):
    """llama_entries() as a training wrapper holds the HF model (prefix cases): the HF names in ``hf_frozen``
    frozen, ``lm_head.weight`` tied to the embedding when ``tied`` (tie_word_embeddings), then every name
    (the alias's owner too) under the wrapper's ``prefix``, as the wrapper module's state_dict() names it and
    so as DeepSpeed records it everywhere (module, param_shapes, frozen_param_shapes/fragments,
    shared_params, param_slice_mappings)."""
    E = llama_entries()
    for e in E:
        if e.name in case.get("hf_frozen", ()):
            e.kind, e.group, e.subgroup = "frozen", None, None
    if case.get("tied"):
        head = E[-1]
        assert head.name == "lm_head.weight", head.name
        E[-1] = Entry(head.name, "alias", head.shape, owner=E[0].name)
    for e in E:
        e.name = case["prefix"] + e.name
        e.owner = e.owner and case["prefix"] + e.owner
    return E


def entries_of(case):
    if "prefix" in case:
        return wrapped_llama_entries(case)
    if case.get("model") == "many_params":
        return many_params_entries(case.get("n_train", MANY_PARAMS))
    if case.get("model") == "tiny_lm_unfused":
        return tiny_lm_unfused()
    return llama_entries() if case.get("model") == "llama" else tiny_lm()


def has_universal(case):
    """ckptfs serves universal/ for partitioned optimizer state: ZeRO-1/2/3, BF16_Optimizer (ZeRO-0 too),
    pipeline; not for ZeRO-0 with a torch optimizer, FP16_Optimizer or FP16_UnfusedOptimizer (state inside the
    model file), nor for Mixture-of-Experts tags (docs/formats/deepspeed.md, Mixture of Experts)."""
    if case.get("moe"):
        return False
    return case["pipeline"] or case["stage"] == 3 or case["optimizer"] in ("zero", "bf16_optimizer")


def groups_of(entries, key):
    """Trainable entries per group (``key``='group') or sub-group (``key``='subgroup'), in module order."""
    n = max(getattr(e, key) for e in entries if e.kind == "train") + 1
    return [[e for e in entries if e.kind == "train" and getattr(e, key) == g] for g in range(n)]


def round_robin_reorder(group, dp):
    """DeepSpeed's ``DeepSpeedZeroOptimizer._round_robin_reorder`` (ZeRO-1/2, ``round_robin_gradients: true``):
    param i of the group goes to bucket i % dp, buckets concatenated in bucket order, each bucket in
    original order.  E.g. 5 params, dp 4: [0, 4, 1, 2, 3]."""
    return [group[i] for j in range(dp) for i in range(j, len(group), dp)]


def flat_order(case, group):
    """The order a ZeRO-1/2 param group is flattened in (= its ``param_shapes`` order):
    ``round_robin_bit16_groups``, which is the module order unless the case sets ``round_robin``."""
    return round_robin_reorder(group, case["dp"]) if case.get("round_robin") else group


# ----------------------------------------------------------------------------------------------------
# values

def special_values(stage, dtype):
    """Values that exercise rounding, overflow, subnormals and signed zero in the bit16 casts.  NaN only
    where the bit16 copy is stored (ZeRO-0/1/2): torch 1.13's bf16 NaN cast gives 0xFFFF, a quirk we do
    not ask ckptfs to copy for ZeRO-3 where it must round the master itself."""
    v = [70000.0, 65520.0, 65519.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1e-6, 1e-8, -0.0, 1e-40,
         1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), float("inf"), float("-inf"), 3.0e38, -1e-45]
    if stage != 3:
        v.append(float("nan"))
    return torch.tensor(v, dtype=torch.float32)


def garbage(rng, n, dtype):
    """n elements of random bit patterns (NaNs, infs included): what padding holds."""
    item = torch.empty(0, dtype=dtype).element_size()
    raw = bytearray(rng.bytes(n * item))
    if n == 0:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).clone()


class Values:
    """Master fp32 values of trainable params, bit16 values of frozen params and buffer contents."""

    def __init__(self, entries, dtype, stage, seed):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.master, self.frozen, self.buffers = {}, {}, {}
        self.moments = None  # name -> {'exp_avg', 'exp_avg_sq'}: tensor-parallel cases (tp_moments)
        for e in entries:
            if e.kind == "train":
                m = torch.from_numpy(rng.standard_normal(e.shape).astype(np.float32) * 0.5)
                if e.name.endswith("out_bias") or getattr(e, "special", False):
                    sv = special_values(stage, dtype)
                    m.view(-1)[: sv.numel()] = sv
                self.master[e.name] = m
            elif e.kind == "frozen":
                self.frozen[e.name] = torch.from_numpy(rng.standard_normal(e.shape).astype(np.float32)).to(dtype)
            elif e.kind == "buffer":
                if e.btype == "float":
                    self.buffers[e.name] = torch.from_numpy(rng.uniform(0.5, 1.5, e.shape).astype(np.float32)).to(dtype)
                elif e.btype == "int64":
                    self.buffers[e.name] = torch.tensor([2 ** 40 + 3, 2 ** 24 + 1, -7], dtype=torch.int64)
                else:
                    self.buffers[e.name] = torch.tensor([True, False, True, True, False])

    def bit16(self, name, dtype):
        return self.master[name].to(dtype)


# ----------------------------------------------------------------------------------------------------
# common pieces of the pickles

def param_group_dict(g, params, weight_decay):
    return {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": weight_decay, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": False,
            "params": params}


def adam_state(rng, n):
    return {"step": torch.tensor(3.0),
            "exp_avg": torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 1e-3),
            "exp_avg_sq": torch.from_numpy(np.abs(rng.standard_normal(n)).astype(np.float32) * 1e-6)}


def ds_config(stage, dtype_name, bf16_optimizer=False, pipeline=False, round_robin=False):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2 if pipeline else 1,
           "steps_per_print": 1,
           "optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-08,
                                                    "weight_decay": 0.0}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                                                        "warmup_num_steps": 2}},
           "gradient_clipping": 1.0, "wall_clock_breakdown": False}
    if stage > 0:
        cfg["zero_optimization"] = {"stage": stage}
        if round_robin:
            cfg["zero_optimization"]["round_robin_gradients"] = True
    if dtype_name == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 100, "hysteresis": 2}
    elif dtype_name == "bf16":
        cfg["bf16"] = {"enabled": True}
    if bf16_optimizer and stage > 0:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def loss_scaler(dtype_name):
    if dtype_name == "fp16":
        return DS.DynamicLossScaler(init_scale=256, dtype=torch.float16)
    return DS.LossScaler(1.0)


def model_state_dict(case, module, buffer_names, optimizer, param_shapes, frozen_shapes, shared, frozen_frags,
                     dp, mp=1):
    sd = {"module": module, "buffer_names": buffer_names, "optimizer": optimizer, "param_shapes": param_shapes,
          "frozen_param_shapes": frozen_shapes, "shared_params": shared, "frozen_param_fragments": frozen_frags,
          "lr_scheduler": {"last_batch_iteration": 2}, "data_sampler": None, "random_ltd": None,
          "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": case["global_steps"],
          "global_samples": 4 * dp * case["global_steps"], "dp_world_size": dp, "mp_world_size": mp,
          **({"checkpoint_parallel_dimensions": case["parallel_dimensions"]} if "parallel_dimensions" in case else {}),
          "ds_config": case["ds_config"], "ds_version": case.get("ds_version", DS_VERSION),
          **client_state(case)}
    return sd


def client_state(case):
    """What the training stack passes as save_checkpoint(client_state=...): DeepSpeed stores it at the top
    level of the model-state files.  Default: what the real fixtures pass."""
    if case.get("client") == "lightning":
        return lightning_client_state(case)
    if case.get("client") == "openrlhf":
        return openrlhf_client_state(case)
    return {"fixture_case": case["name"], "my_epoch": 1, "my_float": 0.125, "my_list": [1, 2, 3],
            "my_tensor": torch.arange(5)}


def save(obj, path):
    torch.save(obj, path)  # zip format, pickle protocol 2 (torch's defaults)


def shapes_od(entries):
    return OD((e.name, torch.Size(e.shape)) for e in entries)


# ----------------------------------------------------------------------------------------------------
# flat-buffer layouts (ZeRO-0 FP16_Optimizer, ZeRO-1/2, BF16_Optimizer)

def flat_group(entries, values, dtype, align, rng):
    """The bit16 flat buffer of one param group: params at their offsets, ``align`` padding filled with
    garbage.  Returns (flat tensor, {name: view})."""
    S = sum(e.numel for e in entries)
    A = align * math.ceil(S / align) if align > 1 else S
    flat = garbage(rng, A, dtype)
    views, off = {}, 0
    for e in entries:
        flat[off: off + e.numel] = values.bit16(e.name, dtype).reshape(-1)
        views[e.name] = flat[off: off + e.numel].view(e.shape)
        off += e.numel
    return flat, views


def master_flat(entries, values, A, rng):
    S = sum(e.numel for e in entries)
    flat = garbage(rng, A, torch.float32)
    if S:
        flat[:S] = torch.cat([values.master[e.name].reshape(-1) for e in entries])
    return flat


def slice_mappings(entries, r, Q):
    od, off = OD(), 0
    for e in entries:
        lo, hi = max(off, r * Q), min(off + e.numel, (r + 1) * Q)
        if lo < hi:
            od[e.name] = DS.fragment_address(numel=hi - lo, start=lo - r * Q)
        off += e.numel
    return od


def build_module(entries, values, dtype, param_views):
    """``module`` OrderedDict: param views (trainable), own-storage frozen params and buffers, alias =
    same tensor object as the owner (so torch.save stores the owner's storage once)."""
    module = OD()
    for e in entries:
        if e.kind == "train":
            module[e.name] = param_views[e.name]
        elif e.kind == "frozen":
            module[e.name] = values.frozen[e.name].clone()
        elif e.kind == "buffer":
            module[e.name] = values.buffers[e.name].clone()
        else:
            module[e.name] = module[e.owner]
    return module


# ----------------------------------------------------------------------------------------------------
# universal checkpoint expectations (docs/formats/universal.md §0, §2, §3): what ckptfs must serve under
# universal/<tag>_universal/ for a tag with partitioned optimizer state.  Computed here from the values
# the generator itself made (masters, the Adam moment arrays it wrote into each rank), never from ckptfs.

class Universal:
    """Collects one tag's universal expectation: ``params`` = OrderedDict name -> {'fp32', 'exp_avg',
    'exp_avg_sq'[, 'step']} (ZeRO<=2: full param shape, 'step' = the group's 0-d step tensor; ZeRO-3: 1-D,
    no step); ``optimizer_state`` = the expected zero/optimizer_state.pt object; ``copies`` = the tag's
    model-state files that the tree copies byte for byte; ``form`` = 'dict' (ZeRO<=2) or 'bare' (ZeRO-3)."""

    def __init__(self):
        self.params, self.optimizer_state, self.copies, self.form = OD(), None, [], None
        self.merge_keys = None  # tensor parallelism: name -> [[key, value], ...] written before 'param'


    def add_flat_group(self, names_shapes, fp32_flat, rank_states, step):
        """ZeRO<=2 param group: ``fp32_flat`` = the group's masters concatenated (params in flat order);
        ``rank_states`` = per rank (exp_avg, exp_avg_sq) partitions of Q elements each, concatenated over
        ranks in rank order (the virtual flat vector); params take [off, off + numel) of each."""
        moments = {k: torch.cat([st[k] for st in rank_states]) for k in ("exp_avg", "exp_avg_sq")}
        off = 0
        for name, shape in names_shapes:
            n = int(np.prod(shape)) if len(shape) else 1
            self.params[name] = {"fp32": fp32_flat[off: off + n].view(shape),
                                 "exp_avg": moments["exp_avg"][off: off + n].view(shape),
                                 "exp_avg_sq": moments["exp_avg_sq"][off: off + n].view(shape),
                                 "step": step}
            off += n

    def write(self, exp_dir):
        save(self.params, os.path.join(exp_dir, "universal.pt"))
        save(self.optimizer_state, os.path.join(exp_dir, "universal_optimizer_state.pt"))


def universal_osd_012(rank0_osd):
    """§3.1: rank 0's inner dict without base_optimizer_state, single_partition_of_fp32_groups and
    param_slice_mappings (order kept), group_paddings all 0, partition_count = [W]*groups (already so),
    plus 'param_groups' = base_optimizer_state['param_groups']."""
    out = {}  # a plain dict, like DeepSpeed's
    for k, v in rank0_osd.items():
        if k in ("base_optimizer_state", "single_partition_of_fp32_groups", "param_slice_mappings"):
            continue
        out[k] = [0] * len(v) if k == "group_paddings" else v
    out["param_groups"] = rank0_osd["base_optimizer_state"]["param_groups"]
    return out


def moment_flats(entries, values, A, rng):
    """A param group's Adam moments as flat vectors of ``A`` elements (params in flat order, padding
    garbage) when ``values`` carries per-param moments (tensor-parallel cases, where every TP rank's
    moments are slices of the unsplit model's); None otherwise (each rank draws its own)."""
    if values.moments is None:
        return None
    out = {}
    for k in ("exp_avg", "exp_avg_sq"):
        out[k] = garbage(rng, A, torch.float32)
        S = sum(e.numel for e in entries)
        if S:
            out[k][:S] = torch.cat([values.moments[e.name][k].reshape(-1) for e in entries])
    return out


def unfused_optimizer_state(groups, values, param_groups=None):
    """FP16_UnfusedOptimizer.state_dict() (DeepSpeed >= 0.17.6 for bf16 without ZeRO): the torch optimizer's
    state per param and fp32_groups, per group the fp32 masters of its trainable params in group order.
    ``param_groups``: ids per group -> the torch param groups (default: decay, then no-decay ones)."""
    state, ids, idx = {}, [], 0
    for g in groups:
        for e in g:
            state[idx] = adam_state(values.rng, e.numel)
            state[idx]["exp_avg"] = state[idx]["exp_avg"].view(e.shape)
            state[idx]["exp_avg_sq"] = state[idx]["exp_avg_sq"].view(e.shape)
            idx += 1
        ids.append(list(range(idx - len(g), idx)))
    pgs = param_groups(ids) if param_groups else \
        [param_group_dict(gi, g, 0.01 if gi == 0 else 0.0) for gi, g in enumerate(ids)]
    return {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": 3,
            "optimizer_state_dict": {"state": state, "param_groups": pgs},
            "fp32_groups": [[values.master[e.name].clone() for e in g] for g in groups]}


def write_zero012(case, tagdir, entries, values, uni=None, mp=0, client=None):
    """ZeRO-0 (all three flavours), ZeRO-1/2 and BF16_Optimizer.  Returns the stored ``module``.  With
    partitioned optimizer state (ZeRO-1/2, BF16_Optimizer) fills ``uni`` (a Universal) when given.
    ``mp``: the model-parallel rank the files are named for (tensor-parallel cases write one set per TP
    rank); ``client``: extra top-level keys of the model-state file (Megatron-DeepSpeed's client state)."""
    stage, dtn, dp = case["stage"], case["dtype"], case["dp"]
    mp_world = case.get("tp", 1) * case.get("pp", 1)  # pipeline + TP: the grid's model group is PP x TP ranks
    model_file = f"mp_rank_{mp:02d}_model_states.pt"
    dtype = DTYPES[dtn]
    rng = values.rng
    groups = groups_of(entries, "group")
    # round_robin_gradients (ZeRO-1/2, stage_1_and_2.py): each group's params are flattened in
    # round_robin_bit16_groups order, and param_shapes (engine._get_zero_param_shapes) walks that same
    # list, so flat buffer, fp32 partitions and Adam moments all follow ``fgroups``; the ``module`` keeps
    # module order, its params being views into the reordered flat buffer (_update_model_bit16_weights).
    fgroups = [flat_order(case, g) for g in groups]
    opt_kind = case["optimizer"]
    buffer_names = [e.name for e in entries if e.kind == "buffer"]
    trainable = [e for e in entries if e.kind == "train"]

    views = {}
    if opt_kind in ("torch", "fp16_unfused"):  # every param owns its storage
        for e in trainable:
            views[e.name] = values.bit16(e.name, dtype).clone()
    else:
        align = 1 if opt_kind == "fp16_optimizer" else 2 * dp
        for g in fgroups:
            _, v = flat_group(g, values, dtype, align, rng)
            views.update(v)
    module = build_module(entries, values, dtype, views)

    if opt_kind == "fp16_unfused":
        save(model_state_dict(case, module, buffer_names, unfused_optimizer_state(groups, values), None, None, None,
                              None, dp), os.path.join(tagdir, model_file))
        return module
    if opt_kind in ("torch", "fp16_optimizer"):
        idx = 0
        state, pgs = {}, []
        for gi, g in enumerate(groups):
            ids = []
            for e in g:
                if opt_kind == "torch":
                    state[idx] = adam_state(rng, e.numel)
                    state[idx]["exp_avg"] = state[idx]["exp_avg"].view(e.shape)
                    state[idx]["exp_avg_sq"] = state[idx]["exp_avg_sq"].view(e.shape)
                ids.append(idx)
                idx += 1
            pgs.append(param_group_dict(gi, ids, 0.01 if gi == 0 else 0.0))
        if opt_kind == "torch":
            optimizer = {"state": state, "param_groups": pgs}
        else:
            inner_state = {gi: adam_state(rng, sum(e.numel for e in g)) for gi, g in enumerate(groups)}
            optimizer = {"dynamic_loss_scale": True, "cur_scale": 256.0, "cur_iter": 3, "last_overflow_iter": -1,
                         "scale_factor": 2.0, "scale_window": 100,
                         "optimizer_state_dict": {"state": inner_state,
                                                  "param_groups": [param_group_dict(gi, [gi], 0.01 if gi == 0 else 0.0)
                                                                   for gi in range(len(groups))]},
                         "fp32_groups_flat": [torch.cat([values.master[e.name].reshape(-1) for e in g]) for g in groups],
                         "clip_grad": 1.0}
        sd = model_state_dict(case, module, buffer_names, optimizer, None, None, None, None, dp)
        save(sd, os.path.join(tagdir, model_file))
        return module

    frozen = [e for e in entries if e.kind == "frozen"]
    if stage == 2 and opt_kind == "zero":
        frozen_shapes = shapes_od(frozen)
        frozen_frags = OD((e.name, module[e.name]) for e in frozen)  # param.detach().cpu(): same storage
    else:
        frozen_shapes, frozen_frags = None, None
    alias = [e for e in entries if e.kind == "alias"]
    # pipeline engines (pipeline + TP cases) save module None: the weights go to the layer files
    sd = model_state_dict(case, None if case["pipeline"] else module, buffer_names, None,
                          [shapes_od(g) for g in fgroups], frozen_shapes,
                          {e.name: e.owner for e in alias}, frozen_frags, dp, mp_world)
    sd.update(client or {})
    save(sd, os.path.join(tagdir, model_file))

    prefix = "bf16_" if dtn == "bf16" else ""
    rank_states = []  # per rank, per group: the Adam state written into that rank's file
    layout = []
    for g in fgroups:
        S = sum(e.numel for e in g)
        A = 2 * dp * math.ceil(S / (2 * dp))
        layout.append((S, A, A // dp, master_flat(g, values, A, rng), moment_flats(g, values, A, rng)))
    for r in range(dp):
        parts, paddings, mappings, state = [], [], [], {}
        for gi, (g, (S, A, Q, mflat, moments)) in enumerate(zip(groups, layout)):
            part = mflat[r * Q: (r + 1) * Q].clone()  # this rank's full padded partition (own storage)
            pad = (A - S) if r == dp - 1 else 0
            if opt_kind == "zero":
                parts.append(part[: Q - pad])  # prefix view: the storage keeps the padding tail
            else:
                parts.append(part)  # BF16_Optimizer keeps the padding
            paddings.append(pad)
            # param_slice_mappings as DeepSpeed writes them: _create_param_mapping walks bit16_groups (module
            # order) and each lp._hp_mapping comes from link_hp_params(lp_param_list=self.bit16_groups[i]),
            # whose _init_lp_to_hp_mapping accumulates offsets in that same original order.  With
            # round_robin_gradients they do not describe the round-robin flat buffer: ds_to_universal.py
            # (extract_zero_shards narrows the fp32 partition and Adam moments with them) mislabels
            # fragments; param_shapes gives the true layout.  (Checked in v0.14.5 and master 38327e0.)
            mappings.append(slice_mappings(g, r, Q))
            if moments is None:
                state[gi] = adam_state(rng, Q)
            else:
                state[gi] = {"step": torch.tensor(3.0), **{k: v[r * Q: (r + 1) * Q].clone() for k, v in moments.items()}}
        rank_states.append(state)
        base = {"state": state, "param_groups": [param_group_dict(gi, [gi], 0.01 if gi == 0 else 0.0)
                                                 for gi in range(len(groups))]}
        if opt_kind == "zero":
            osd = {"loss_scaler": loss_scaler(dtn), "dynamic_loss_scale": dtn == "fp16", "overflow": False,
                   "clip_grad": 1.0, "base_optimizer_state": base, "single_partition_of_fp32_groups": parts,
                   "zero_stage": DS.ZeroStageEnum(stage), "group_paddings": paddings,
                   "partition_count": [dp] * len(groups), "ds_version": DS_VERSION,
                   "param_slice_mappings": mappings}
        else:
            osd = {"clip_grad": 1.0, "base_optimizer_state": base, "single_partition_of_fp32_groups": parts,
                   "group_paddings": paddings, "partition_count": [dp] * len(groups), "ds_version": DS_VERSION,
                   "param_slice_mappings": mappings}
        save({"optimizer_state_dict": osd, "ds_config": case["ds_config"], "ds_version": DS_VERSION},
             os.path.join(tagdir, f"{prefix}zero_pp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt"))
        if r == 0 and uni is not None:
            uni.optimizer_state = universal_osd_012(osd)
    if uni is not None:
        uni.form, uni.copies = "dict", [model_file]
        for gi, g in enumerate(fgroups):
            fp32_flat = torch.cat([values.master[e.name].reshape(-1) for e in g])
            uni.add_flat_group([(e.name, e.shape) for e in g], fp32_flat, [st[gi] for st in rank_states],
                               rank_states[0][gi]["step"])
    return module


def write_zero3(case, tagdir, entries, values, uni=None):
    dtn, dp = case["dtype"], case["dp"]
    dtype = DTYPES[dtn]
    rng = values.rng
    subgroups = groups_of(entries, "subgroup")
    groups = groups_of(entries, "group")
    # param group j -> its sub-group indices
    pg_sub = [sorted({e.subgroup for e in g}) for g in groups]
    frozen = [e for e in entries if e.kind == "frozen"]
    buffer_names = [e.name for e in entries if e.kind == "buffer"]
    prefix = "bf16_" if dtn == "bf16" else ""
    rank_states = []  # per rank, per sub-group: the Adam state written into that rank's file

    def part_of(full_flat, n, r, dt):
        p = math.ceil(n / dp)
        out = garbage(rng, p, dt)
        lo, hi = r * p, min((r + 1) * p, n)
        if hi > lo:
            out[: hi - lo] = full_flat[lo:hi]
        return out

    for r in range(dp):
        module = OD()
        for e in entries:
            if e.kind in ("train", "frozen"):
                module[e.name] = torch.empty(0, dtype=dtype)
            elif e.kind == "buffer":
                module[e.name] = values.buffers[e.name].clone()
            else:
                module[e.name] = module[e.owner]
        frags = OD((e.name, part_of(values.frozen[e.name].reshape(-1), e.numel, r, dtype)) for e in frozen)
        shared = {e.name: e.owner for e in entries if e.kind == "alias"} if r == 0 else {}
        sd = model_state_dict(case, module, buffer_names, None, [shapes_od(sg) for sg in subgroups],
                              shapes_od(frozen), shared, frags, dp)
        save(sd, os.path.join(tagdir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))

        flat_groups, state = [], {}
        for i, sg in enumerate(subgroups):
            parts = [part_of(values.master[e.name].reshape(-1), e.numel, r, torch.float32) for e in sg]
            flat_groups.append(torch.cat(parts))
            state[i] = adam_state(rng, flat_groups[-1].numel())
        rank_states.append(state)
        osd = {"zero_stage": DS.ZeroStageEnum.weights, "loss_scaler": loss_scaler(dtn),
               "dynamic_loss_scale": dtn == "fp16", "overflow": False, "partition_count": dp,
               "optimizer_state_dict": {"state": state,
                                        "param_groups": [param_group_dict(j, pg_sub[j], 0.01 if j == 0 else 0.0)
                                                         for j in range(len(groups))]},
               "fp32_flat_groups": flat_groups}
        save({"optimizer_state_dict": osd, "ds_config": case["ds_config"], "ds_version": DS_VERSION},
             os.path.join(tagdir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
        if r == 0 and uni is not None:
            # §3.2: rank 0's inner dict, complete, + 'param_groups' (the same list object)
            uni.optimizer_state = dict(osd)
            uni.optimizer_state["param_groups"] = osd["optimizer_state_dict"]["param_groups"]
    if uni is None:
        return
    uni.form = "bare"
    uni.copies = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(dp)]
    # rank r holds elements [r*p, r*p + real_r) of each param, at offset sum(p_j) of its sub-group; the
    # merged moments are the concatenation of those real elements over r (exactly numel elements)
    for i, sg in enumerate(subgroups):
        off = 0
        for e in sg:
            p = math.ceil(e.numel / dp)
            d = {"fp32": values.master[e.name].reshape(-1).clone()}
            for k in ("exp_avg", "exp_avg_sq"):
                d[k] = torch.cat([rank_states[r][i][k][off: off + max(0, min(p, e.numel - r * p))]
                                  for r in range(dp)])
                assert d[k].numel() == e.numel
            uni.params[e.name] = d
            off += p


# ----------------------------------------------------------------------------------------------------
# expectations

def expected_outputs(case, entries, values, module):
    """(fp32 dict, model dict) in ckptfs's documented order."""
    stage, dtype = case["stage"], DTYPES[case["dtype"]]
    fp32, model = {}, {}
    if case["optimizer"] == "torch":  # fp32: the module is the master
        for k, v in module.items():
            fp32[k] = v.float().clone() if v.is_floating_point() else v.clone()
            model[k] = v.clone()
        return fp32, model
    for e in entries:
        if e.kind == "buffer":
            b = values.buffers[e.name]
            fp32[e.name] = b.float() if b.is_floating_point() else b.clone()
    for e in entries:
        if e.kind == "frozen":
            fp32[e.name] = values.frozen[e.name].float()
    for g in groups_of(entries, "subgroup" if stage == 3 else "group"):
        for e in (g if stage == 3 else flat_order(case, g)):  # trainable in param_shapes order
            fp32[e.name] = values.master[e.name].clone()
    for e in entries:
        if e.kind == "alias":
            fp32[e.name] = fp32[e.owner].clone()
    if stage == 3:
        for e in entries:
            if e.kind == "train":
                model[e.name] = values.master[e.name].to(dtype)
            elif e.kind == "frozen":
                model[e.name] = values.frozen[e.name].clone()
            elif e.kind == "buffer":
                model[e.name] = values.buffers[e.name].clone()
            else:
                model[e.name] = model[e.owner].clone()
    else:
        for k, v in module.items():
            model[k] = v.clone()
    return fp32, model


# ----------------------------------------------------------------------------------------------------
# pipeline case (like the real pp2_z1_fp32_ws4: 2 stages x DP 2, ZeRO-1, tied embedding)

def write_pipeline(case, tagdir, seed, uni=None):
    dtn, dp = case["dtype"], case["dp"]
    dtype = DTYPES[dtn]
    rng = np.random.default_rng(seed)

    def rnd(shape, scale=0.5):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32) * scale)

    # layers: (index, file?, [(local key, kind, shape, btype)])
    block = [("ln.weight", "train", (HIDDEN,)), ("ln.bias", "train", (HIDDEN,)), ("fc1.weight", "train", (FFN, HIDDEN)),
             ("fc1.bias", "train", (FFN,)), ("fc2.weight", "train", (HIDDEN, FFN)), ("fc2.bias", "train", (HIDDEN,))]
    layers = [
        (0, "tied_modules.embed.", [("weight", "train", (VOCAB, HIDDEN)), ("pos", "frozen", (SEQ, HIDDEN)),
                                    ("mix", "buffer_float", (HIDDEN,)), ("step_count", "buffer_int", (3,))]),
        (1, "1.", block), (2, "2.", block),
        (3, "3.", [("ln_f.weight", "train", (HIDDEN,)), ("ln_f.bias", "train", (HIDDEN,)),
                   ("out_bias_holder.weight", "train", (1, 1)), ("out_bias_holder.bias", "train", (1,))]),
    ]
    stages = [[0, 1, 2], [3]]  # layer 4 = TiedLayerSpec('embed', forward_fn=...) on stage 1: no file
    tied = "tied_modules.embed.weight"
    master, stored = {}, {}
    model_exp = {}
    for li, pre, keys in layers:
        sd = OD()
        for k, kind, shape in keys:
            name = pre + k
            if kind == "train":
                master[name] = rnd(shape)
                if k == "ln_f.weight":
                    sv = special_values(1, dtype)
                    master[name].view(-1)[: min(sv.numel(), HIDDEN)] = sv[:HIDDEN]
                t = master[name].to(dtype)
            elif kind == "frozen":
                t = rnd(shape, 1.0).to(dtype)
            elif kind == "buffer_float":
                t = torch.from_numpy(rng.uniform(0.5, 1.5, shape).astype(np.float32)).to(dtype)
            else:
                t = torch.tensor([2 ** 40 + 3, 2 ** 24 + 1, -7], dtype=torch.int64)
            sd[k] = t.clone()  # layer files clone every tensor
            stored[name] = (kind, t)
            model_exp[name] = t.clone()
        save(sd, os.path.join(tagdir, f"layer_{li:02d}-model_states.pt"))
    # stage 1 holds its own replica of the tied weight's master; DeepSpeed keeps replicas in sync, but we
    # perturb it so that a reader taking the tied master from the wrong stage is caught.
    stage1_tied_master = master[tied] + 1e-3
    buffer_names = [n for n, (k, _) in stored.items() if k.startswith("buffer")]
    # ZeRO-0 BF16_Optimizer (DeepSpeed >= 0.18.5): no param_shapes / shared_params, and each stage's
    # model-state file holds its DP rank 0's BF16_Optimizer state too
    bf16opt = case["optimizer"] == "bf16_optimizer"
    per_stage_names = []
    for s, lids in enumerate(stages):
        names = [tied] if s == 1 else []
        for li, pre, keys in layers:
            if li in lids:
                names += [pre + k for k, kind, _ in keys if kind == "train"]
        per_stage_names.append(names)
        shapes = OD((n, torch.Size(master[n].shape)) for n in names)
        vals = [stage1_tied_master if (s == 1 and n == tied) else master[n] for n in names]
        S = sum(v.numel() for v in vals)
        A = 2 * dp * math.ceil(S / (2 * dp))
        Q = A // dp
        mflat = garbage(rng, A, torch.float32)
        mflat[:S] = torch.cat([v.reshape(-1) for v in vals])

        class _E:
            def __init__(self, n, v):
                self.name, self.numel = n, v.numel()
        ents = [_E(n, v) for n, v in zip(names, vals)]
        stage_states = []
        version = case.get("ds_version", DS_VERSION)
        for r in range(dp):
            part = mflat[r * Q: (r + 1) * Q].clone()
            pad = (A - S) if r == dp - 1 else 0
            st0 = adam_state(rng, Q)
            stage_states.append(st0)
            base = {"state": {0: st0}, "param_groups": [param_group_dict(0, [0], 0.0)]}
            mappings = [slice_mappings(ents, r, Q)]
            if bf16opt:  # keeps the padding, no loss scaler or zero_stage
                osd = {"clip_grad": 1.0, "base_optimizer_state": base, "single_partition_of_fp32_groups": [part],
                       "group_paddings": [pad], "partition_count": [dp], "ds_version": version,
                       "param_slice_mappings": mappings}
            else:
                osd = {"loss_scaler": loss_scaler(dtn), "dynamic_loss_scale": dtn == "fp16", "overflow": False,
                       "clip_grad": 1.0, "base_optimizer_state": base,
                       "single_partition_of_fp32_groups": [part[: Q - pad]], "zero_stage": DS.ZeroStageEnum(1),
                       "group_paddings": [pad], "partition_count": [dp], "ds_version": version,
                       "param_slice_mappings": mappings}
            if r == 0:
                msd = model_state_dict(case, None, buffer_names, osd if bf16opt else None,
                                       None if bf16opt else [shapes], None, None if bf16opt else {}, None, dp, mp=2)
                save(msd, os.path.join(tagdir, f"mp_rank_{s:02d}_model_states.pt"))
            prefix = "bf16_" if dtn == "bf16" else ""
            save({"optimizer_state_dict": osd, "ds_config": case["ds_config"], "ds_version": version},
                 os.path.join(tagdir, f"{prefix}zero_pp_rank_{r}_mp_rank_{s:02d}_optim_states.pt"))
            if s == 0 and r == 0 and uni is not None:
                uni.optimizer_state = universal_osd_012(osd)  # from (pp 0, dp 0)
        if uni is not None:
            # a name held by several stages (the tied embedding) comes from the lowest stage: stage 1's
            # perturbed replica must not show up
            uni.form = "dict"
            uni.copies.append(f"mp_rank_{s:02d}_model_states.pt")
            fp32_flat = torch.cat([v.reshape(-1) for v in vals])
            before = OD(uni.params)
            uni.add_flat_group([(n, tuple(v.shape)) for n, v in zip(names, vals)], fp32_flat, stage_states,
                               stage_states[0]["step"])
            for n in names:
                if n in before:
                    uni.params[n] = before[n]
            uni.params = OD((n, uni.params[n]) for n in list(before) + [n for n in names if n not in before])
    fp32 = {}
    for n, (kind, t) in stored.items():
        if kind.startswith("buffer"):
            fp32[n] = t.float() if t.is_floating_point() else t.clone()
    for n, (kind, t) in stored.items():
        if kind == "frozen":
            fp32[n] = t.float()
    for n in per_stage_names[0] + [n for n in per_stage_names[1] if n != tied]:
        fp32[n] = master[n].clone()
    return fp32, model_exp


# ----------------------------------------------------------------------------------------------------
# tensor parallelism: Megatron-DeepSpeed's non-pipe GPTModel (data parallel, no pipeline), one
# mp_rank_XX_model_states.pt per TP rank holding that rank's slices, ZeRO/BF16_Optimizer files per
# (dp, tp).  The unsplit model (masters, Adam moments, frozen values) is drawn first; every TP rank gets
# its slices, which write_zero012 flattens and DP-partitions as for a single rank.  Expectations come
# from the unsplit model: model.pt / fp32.pt with the padded vocabulary (what Megatron holds at TP=1),
# universal.pt with the vocabulary rows trimmed to original_vocab_size (ds_to_universal's merge_tp_slices).

# Merged shapes coincide on purpose: position_embeddings (replicated: {'param'}), query_key_value
# ({'cat_dim': 0, 'param'}) and, with SwiGLU, dense_h_to_4h ({'cat_dim': 0, 'param_n_sub_params': 2, 'param'})
# are all [48, 16] (biases [48]): universal files of one (name, dtype, shape) but different dict keys.
TP_HIDDEN, TP_FFN, TP_VOCAB, TP_LAYERS = 16, 24, 45, 2
TP_SEQ = 3 * TP_HIDDEN
TP_VOCAB_DIVISOR = 8  # --make-vocab-size-divisible-by (Megatron's default 128 would make the vocab mostly padding)
TP_UCP_VERSION = 0.2  # DeepSpeed's UNIVERSAL_CHECKPOINT_VERSION_VALUE up to v0.19.1
# split rule -> the keys ds_to_universal writes before 'param' (vocabulary: + vocab_tensor)
TP_MERGE_KEYS = {"replicated": [], "row": [["cat_dim", 1]], "column": [["cat_dim", 0]],
                 "swiglu": [["cat_dim", 0], ["param_n_sub_params", 2]], "vocab": [["cat_dim", 0], ["vocab_tensor", True]]}

# Fused sub-parameters (case["gqa"]): query_key_value is a fused GQA projection [q; k; v] that AutoTP cuts per
# sub-parameter, each TP rank holding [q_r; k_r; v_r], declared in universal_checkpoint_info version 0.4 by
# 'parameter_with_sub_params' ({'patterns', 'shape' (the sub-parameter sizes as a tuple at partition_dim),
# 'partition_dim': 0}) and 'sub_param_shard_widths' ({pattern: [[width of each TP rank] per sub-parameter]}).
# ds_to_universal's merge_tp_slices concatenates each sub-parameter's rank pieces, then the sub-parameters,
# and stores {'sub_param_shape': SubparamShape(**entry), 'param'} (version >= 0.4: the entry as the checkpoint
# holds it, list or tuple alike, the full pattern list; no cat_dim).
TP_SUB_PARAMS_UCP_VERSION = 0.4  # UNIVERSAL_CHECKPOINT_VERSION_VALUE since sub_param_shard_widths
SUBPARAM_SHAPE_CLASS = ("deepspeed.checkpoint.universal_checkpoint", "SubparamShape")
TP_QKV = "self_attention.query_key_value."


def gqa_sizes(case):
    """(q, k, v) rows of the fused qkv projection."""
    g = case["gqa"]
    return (g["q_heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"])


def gqa_shard_widths(case):
    """Per sub-parameter, each TP rank's rows, cut on KV-head boundaries as AutoTP's get_shard_size_list
    does when the KV-head count divides the size: rank r holds kv_heads // tp (+1 for r < kv_heads % tp)
    KV heads and the query heads of their groups, so 3 KV heads over TP 2 give [2/3, 1/3] of each."""
    tp, kv = case["tp"], case["gqa"]["kv_heads"]
    heads = [kv // tp + (1 if r < kv % tp else 0) for r in range(tp)]
    return [[size * h // kv for h in heads] for size in gqa_sizes(case)]


def tp_sub_params_info(case):
    """(parameter_with_sub_params, sub_param_shard_widths) for the fused qkv weights and biases.
    style 'autotp': as collect_autotp_universal_checkpoint_info publishes them, one entry per param with the
    pattern rf"^{re.escape(name)}$" and 'shape' a list (list(spec) with the tuple of sizes at dim 0:
    weight [(q, k, v), H], bias [(q, k, v)]).  style 'megatron': hand-written patterns as a Megatron-style
    client would write them, tuples with a -1 placeholder: the weights one entry listing both layers'
    patterns, shape ((q, k, v), -1); the biases one '\\d+' pattern, shape ((q, k, v),)."""
    sizes, widths = gqa_sizes(case), gqa_shard_widths(case)
    L = "language_model.encoder.layers."
    if case["gqa"]["style"] == "autotp":
        entries = []
        for l in range(TP_LAYERS):
            for k in ("weight", "bias"):
                name = f"{L}{l}.{TP_QKV}{k}"
                shape = [sizes, TP_HIDDEN] if k == "weight" else [sizes]
                entries.append({"patterns": [rf"^{re.escape(name)}$"], "shape": shape, "partition_dim": 0})
    else:
        entries = [{"patterns": [rf"{L}{l}.{TP_QKV}weight" for l in range(TP_LAYERS)], "shape": (sizes, -1),
                    "partition_dim": 0},
                   {"patterns": [rf"{L}\d+.{TP_QKV}bias"], "shape": (sizes, ), "partition_dim": 0}]
    widths_by_pattern = {p: [list(w) for w in widths] for e in entries for p in e["patterns"]}
    return entries, widths_by_pattern


def subparam_shape_json(entry):
    """case.json form of the SubparamShape object a universal file must hold for ``entry``: the class's
    global name and its fields as a Python literal (keeps lists and tuples apart; ast.literal_eval)."""
    return {"module": SUBPARAM_SHAPE_CLASS[0], "name": SUBPARAM_SHAPE_CLASS[1],
            "fields": repr({"patterns": entry["patterns"], "shape": entry["shape"],
                            "partition_dim": entry["partition_dim"]})}


def tp_sub_params_merge_keys(case):
    """name -> merge keys ([['sub_param_shape', subparam_shape_json]]) of the fused params."""
    entries, _ = tp_sub_params_info(case)
    out = {}
    for l in range(TP_LAYERS):
        for k in ("weight", "bias"):
            name = f"language_model.encoder.layers.{l}.{TP_QKV}{k}"
            hit = [e for e in entries if any(re.match(p, name) for p in e["patterns"])]
            assert len(hit) == 1, (name, hit)
            out[name] = [["sub_param_shape", subparam_shape_json(hit[0])]]
    return out


def tp_padded_vocab(tp):
    """Megatron's _vocab_size_with_padding: up to a multiple of divisor * TP."""
    multiple = TP_VOCAB_DIVISOR * tp
    return multiple * math.ceil(TP_VOCAB / multiple)


def tp_gpt_entries(case):
    """The unsplit GPTModel's state_dict (module order) with each entry's TP split rule in ``e.tp``:
    'vocab' (vocab-parallel rows of the padded vocabulary), 'column' (dim 0), 'row' (dim 1), 'swiglu'
    (dense_h_to_4h = [gate; up], each rank [gate_r; up_r]), 'replicated'.  Param groups as Megatron's
    get_param_groups: decay (matrices) = 0, no-decay (biases, norms) = 1.  ``case['frozen']`` names
    params without requires_grad."""
    H, F, Vp = TP_HIDDEN, TP_FFN, tp_padded_vocab(case["tp"])
    mlp_rule, h4h = ("swiglu", 2 * F) if case["swiglu"] else ("column", F)
    E = []

    def add(name, shape, rule):
        full = "language_model." + name
        kind = "frozen" if full in case.get("frozen", ()) else "train"
        group = 0 if len(shape) > 1 else 1
        E.append(Entry(full, kind, shape, group=group, subgroup=group))
        E[-1].tp = rule

    add("embedding.word_embeddings.weight", (Vp, H), "vocab")
    add("embedding.position_embeddings.weight", (TP_SEQ, H), "replicated")
    for l in range(TP_LAYERS):
        p = f"encoder.layers.{l}."
        add(p + "input_layernorm.weight", (H,), "replicated")
        add(p + "input_layernorm.bias", (H,), "replicated")
        if case.get("gqa"):  # fused GQA [q; k; v], each TP rank [q_r; k_r; v_r]
            qkv, widths = sum(gqa_sizes(case)), gqa_shard_widths(case)
            add(p + "self_attention.query_key_value.weight", (qkv, H), ("sub_params", widths))
            add(p + "self_attention.query_key_value.bias", (qkv,), ("sub_params", widths))
        else:
            add(p + "self_attention.query_key_value.weight", (3 * H, H), "column")
            add(p + "self_attention.query_key_value.bias", (3 * H,), "column")
        E[-1].special = l == 0  # rounding/overflow/NaN values, spread over the TP ranks
        add(p + "self_attention.dense.weight", (H, H), "row")
        add(p + "self_attention.dense.bias", (H,), "replicated")
        add(p + "post_attention_layernorm.weight", (H,), "replicated")
        add(p + "post_attention_layernorm.bias", (H,), "replicated")
        add(p + "mlp.dense_h_to_4h.weight", (h4h, H), mlp_rule)
        add(p + "mlp.dense_h_to_4h.bias", (h4h,), mlp_rule)
        add(p + "mlp.dense_4h_to_h.weight", (H, F), "row")
        add(p + "mlp.dense_4h_to_h.bias", (H,), "replicated")
    add("encoder.final_layernorm.weight", (H,), "replicated")
    add("encoder.final_layernorm.bias", (H,), "replicated")
    add("output_layer.weight", (Vp, H), "vocab")  # untied (--untie-embeddings-and-output-weights)
    return E


def tp_universal_info(case):
    """universal_checkpoint_info as Megatron-DeepSpeed writes it into every mp_rank file
    (checkpointing._universal_checkpoint_info + GPTModel.universal_checkpoint_info, non-pipe names):
    re.match patterns, '.' unescaped as there."""
    L = r"language_model.encoder.layers.\d+."
    info = {"universal_checkpoint_version": TP_UCP_VERSION, "original_vocab_size": TP_VOCAB,
            "padded_vocab_size": tp_padded_vocab(case["tp"]),
            "vocabulary_parameter_patterns": [r"language_model.embedding.word_embeddings.weight",
                                              r"language_model.output_layer.weight"],
            "tp_replicated_parameter_patterns": [r"language_model.embedding.position_embeddings.weight",
                                                 L + "input_layernorm.weight", L + "input_layernorm.bias",
                                                 L + "post_attention_layernorm.weight",
                                                 L + "post_attention_layernorm.bias", L + "self_attention.dense.bias",
                                                 L + "mlp.dense_4h_to_h.bias",
                                                 r"language_model.encoder.final_layernorm.weight",
                                                 r"language_model.encoder.final_layernorm.bias"],
            "parameter_with_row_parallelism_patterns": [L + "mlp.dense_4h_to_h.weight", L + "self_attention.dense.weight"]}
    if case["swiglu"]:
        info["parameter_with_2_sub_params_cat_dim_0"] = [L + "mlp.dense_h_to_4h.weight", L + "mlp.dense_h_to_4h.bias"]
    if case.get("gqa"):
        info["universal_checkpoint_version"] = TP_SUB_PARAMS_UCP_VERSION
        info["parameter_with_sub_params"], info["sub_param_shard_widths"] = tp_sub_params_info(case)
    return info


def tp_slice(rule, full, r, tp):
    """TP rank r's slice of an unsplit tensor (own storage)."""
    if isinstance(rule, tuple):  # ("sub_params", widths): rank r's rows of each sub-parameter, concatenated
        _, widths = rule
        subs = full.split([sum(w) for w in widths], dim=0)
        return torch.cat([sub.split(w, dim=0)[r] for sub, w in zip(subs, widths)])
    if rule == "replicated":
        return full.clone()
    if rule == "row":
        return tp_cols(full, r, tp).clone()
    if rule == "swiglu":
        return torch.cat(tp_gated_rows(full, r, tp))
    return tp_rows(full, r, tp).clone()  # column, vocab


def tp_rank_model(entries, full, r, tp):
    """(entries with TP rank r's shapes, a Values of its slices) from the unsplit model."""
    rule = {e.name: e.tp for e in entries}
    vals = object.__new__(Values)
    vals.rng = full.rng
    vals.master = {n: tp_slice(rule[n], t, r, tp) for n, t in full.master.items()}
    vals.frozen = {n: tp_slice(rule[n], t, r, tp) for n, t in full.frozen.items()}
    vals.buffers = full.buffers
    vals.moments = {n: {k: tp_slice(rule[n], t, r, tp) for k, t in m.items()} for n, m in full.moments.items()}
    ents = []
    for e in entries:
        shape = (vals.master if e.kind == "train" else vals.frozen)[e.name].shape
        ents.append(Entry(e.name, e.kind, shape, group=e.group, subgroup=e.subgroup))
    return ents, vals


def tp_client_state(case, info):
    """Megatron-DeepSpeed's client state in each mp_rank file (save_checkpoint's state_dict, less rng)."""
    args = argparse.Namespace(tensor_model_parallel_size=case["tp"],
                              pipeline_model_parallel_size=case.get("pp", 1),
                              num_layers=TP_LAYERS, hidden_size=TP_HIDDEN, ffn_hidden_size=TP_FFN,
                              max_position_embeddings=TP_SEQ, padded_vocab_size=tp_padded_vocab(case["tp"]),
                              make_vocab_size_divisible_by=TP_VOCAB_DIVISOR, swiglu=case["swiglu"],
                              untie_embeddings_and_output_weights=not case["pipeline"],
                              iteration=case["global_steps"])
    return {"args": args, "checkpoint_version": 3.0, "iteration": case["global_steps"],
            "universal_checkpoint_info": info}


def tp_moments(full, entries):
    """Adam moments of the unsplit model's trainable params (every TP rank's moments are their slices)."""
    return {e.name: {"exp_avg": torch.from_numpy(full.rng.standard_normal(e.shape).astype(np.float32) * 1e-3),
                     "exp_avg_sq": torch.from_numpy(np.abs(full.rng.standard_normal(e.shape)).astype(np.float32) * 1e-6)}
            for e in entries if e.kind == "train"}


def tp_check_rank(ru, whole, rule, r, tp):
    """The files hold the unsplit model's slices: TP rank r's own universal view (``ru``, a Universal) is
    the slice of ``whole`` (a Values with moments)."""
    for n, d in ru.params.items():
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            t = whole.master[n] if k == "fp32" else whole.moments[n][k]
            assert torch.equal(d[k].view(torch.int32), tp_slice(rule[n], t, r, tp).view(torch.int32)), (r, n, k)


def write_tensor_parallel(case, tagdir, seed, uni):
    """Writes every TP rank's files; fills ``uni`` from the unsplit model; returns (fp32, model)."""
    tp, dtype = case["tp"], DTYPES[case["dtype"]]
    entries = tp_gpt_entries(case)
    full = Values(entries, dtype, case["stage"], seed)
    full.moments = tp_moments(full, entries)
    client = tp_client_state(case, tp_universal_info(case))
    ranks = []
    for r in range(tp):
        ents, vals = tp_rank_model(entries, full, r, tp)
        ranks.append(Universal())
        write_zero012(case, tagdir, ents, vals, ranks[-1], mp=r, client=client)
    rule = {e.name: e.tp for e in entries}
    for r, ru in enumerate(ranks):
        tp_check_rank(ru, full, rule, r, tp)
    uni.form, uni.optimizer_state = "dict", ranks[0].optimizer_state  # ds_to_universal: (pp 0, tp 0, dp 0)
    uni.copies = [c for ru in ranks for c in ru.copies]
    uni.merge_keys = OD()
    sub_keys = tp_sub_params_merge_keys(case) if case.get("gqa") else {}
    for n, d in ranks[0].params.items():  # rank 0's param_shapes order
        rows = TP_VOCAB if rule[n] == "vocab" else None
        uni.params[n] = OD((k, (full.master[n] if k == "fp32" else full.moments[n][k])[:rows].clone())
                           for k in ("fp32", "exp_avg", "exp_avg_sq"))
        uni.params[n]["step"] = d["step"]
        uni.merge_keys[n] = sub_keys[n] if isinstance(rule[n], tuple) else TP_MERGE_KEYS[rule[n]]
    module = build_module(entries, full, dtype, {n: full.bit16(n, dtype) for n in full.master})
    return expected_outputs(case, entries, full, module)


# ----------------------------------------------------------------------------------------------------
# pipeline + tensor parallelism: Megatron-DeepSpeed's GPTModelPipe (a PipelineModule) on a
# PipeModelDataParallelTopology, axes ['pipe', 'data', 'model'] (global rank = (pp * DP + dp) * TP + tp).
# Layers as GPTModelPipe builds them (bf16): 0 _to_float16 (a function: no file), 1 TiedLayerSpec('embed',
# EmbeddingPipe), 2 .. 1+L ParallelTransformerLayerPipe, 2+L LayerNorm, 3+L TiedLayerSpec('embed',
# forward_fn=_logits_helper) (a partial: no file), 4+L float16_to_fp32 (no file); stage 0 = layers 0..2,
# stage 1 = 3..6.  Per (pp, tp), written by its data rank 0 (PipelineParallelGrid: model-parallel rank
# m = pp * TP + tp, the rank among the data-index-0 ranks): mp_rank_{m:02d}_model_states.pt (module None,
# param_shapes of that rank's slices with pipeline names, universal_checkpoint_info) and per layer with
# parameters layer_{idx:02d}-model_{tp:02d}-model_states.pt (PipelineModule.ckpt_layer_path with the grid's
# rank repr 'model_XX': that TP rank's slice of the layer's state dict, cloned); per (pp, tp, dp)
# [bf16_]zero_pp_rank_{dp}_mp_rank_{m:02d}_optim_states.pt.  The tied embedding's params (word and
# position embeddings) are in both stages' param_shapes and optimizer partitions; only stage 0 writes its
# layer file.  Stage 1's replica masters are perturbed (+1e-3, moments x2) so that a reader taking them
# from the last stage is caught (ds_to_universal skips pipeline_replicated_parameter_patterns on pp > 0).

def pp_tp_layers(case):
    """GPTModelPipe's layers that have a state dict: [(global layer index, name prefix, [(key, shape, TP
    rule)])] in layer order, and the layer indices of each stage.  Names as PipelineModule names its
    parameters: '{idx}.{key}', the tied module 'tied_modules.embed.{key}'."""
    H, F, Vp, L = TP_HIDDEN, TP_FFN, tp_padded_vocab(case["tp"]), TP_LAYERS
    mlp_rule, h4h = ("swiglu", 2 * F) if case["swiglu"] else ("column", F)
    block = [("input_layernorm.weight", (H,), "replicated"), ("input_layernorm.bias", (H,), "replicated"),
             ("self_attention.query_key_value.weight", (3 * H, H), "column"),
             ("self_attention.query_key_value.bias", (3 * H,), "column"),
             ("self_attention.dense.weight", (H, H), "row"), ("self_attention.dense.bias", (H,), "replicated"),
             ("post_attention_layernorm.weight", (H,), "replicated"),
             ("post_attention_layernorm.bias", (H,), "replicated"),
             ("mlp.dense_h_to_4h.weight", (h4h, H), mlp_rule), ("mlp.dense_h_to_4h.bias", (h4h,), mlp_rule),
             ("mlp.dense_4h_to_h.weight", (H, F), "row"), ("mlp.dense_4h_to_h.bias", (H,), "replicated")]
    layers = [(1, "tied_modules.embed.", [("word_embeddings.weight", (Vp, H), "vocab"),
                                          ("position_embeddings.weight", (TP_SEQ, H), "replicated")])]
    layers += [(2 + l, f"{2 + l}.", block) for l in range(L)]
    layers.append((2 + L, f"{2 + L}.", [("weight", (H,), "replicated"), ("bias", (H,), "replicated")]))
    assert case["pp"] == 2 and L == 2
    stages = [[0, 1, 2], [3, 4, 5, 6]]  # 5 = the tied logits layer (parameters of the tied module)
    return layers, stages


def pp_tp_universal_info(case):
    """UniversalCheckpointInfo(using_model_pipe=True) of Megatron-DeepSpeed (layernorm, linear biases,
    learned position embeddings, tied embeddings): pipeline names, re.match patterns."""
    info = {"universal_checkpoint_version": TP_UCP_VERSION, "original_vocab_size": TP_VOCAB,
            "padded_vocab_size": tp_padded_vocab(case["tp"]),
            "vocabulary_parameter_patterns": [r"tied_modules.embed.word_embeddings.weight"],
            "pipeline_replicated_parameter_patterns": [r"tied_modules.embed.word_embeddings.weight",
                                                       r"tied_modules.embed.position_embeddings.weight"],
            "tp_replicated_parameter_patterns": [r"\d+.input_layernorm.weight", r"\d+.post_attention_layernorm.weight",
                                                 r"\d+.weight", r"\d+.bias",
                                                 "tied_modules.embed.position_embeddings.weight",
                                                 r"\d+.self_attention.dense.bias", r"\d+.mlp.dense_4h_to_h.bias",
                                                 r"\d+.input_layernorm.bias", r"\d+.post_attention_layernorm.bias"],
            "parameter_with_row_parallelism_patterns": [r"\d+.mlp.dense_4h_to_h.weight",
                                                        r"\d+.self_attention.dense.weight"],
            "parameter_with_2_sub_params_cat_dim_0": []}
    if case["swiglu"]:
        info["parameter_with_2_sub_params_cat_dim_0"] = [r"\d+.mlp.dense_h_to_4h.weight", r"\d+.mlp.dense_h_to_4h.bias"]
    return info


def pp_tp_stage_values(full, entries, names, tied, perturb):
    """A Values holding ``names`` of the unsplit model (the stage's replicas), with the tied params'
    masters + 1e-3 and moments x 2 when ``perturb`` (the last stage's replica)."""
    vals = object.__new__(Values)
    vals.rng, vals.buffers, vals.frozen = full.rng, {}, {}
    vals.master = {n: full.master[n] + 1e-3 if perturb and n in tied else full.master[n] for n in names}
    vals.moments = {n: {k: v * 2 if perturb and n in tied else v for k, v in full.moments[n].items()}
                    for n in names}
    return [e for e in entries if e.name in names], vals


def write_pipeline_tensor_parallel(case, tagdir, seed, uni):
    """Writes every (pp, tp, dp) rank's files; fills ``uni`` from the unsplit model; returns (fp32, model)."""
    tp, pp, dtype = case["tp"], case["pp"], DTYPES[case["dtype"]]
    layers, stages = pp_tp_layers(case)
    entries = []
    for _, pre, keys in layers:
        for k, shape, rule in keys:
            E = Entry(pre + k, "train", shape, group=0 if len(shape) > 1 else 1, subgroup=0 if len(shape) > 1 else 1)
            E.tp = rule
            E.special = pre + k == "2.self_attention.query_key_value.bias"  # spread over the TP ranks
            entries.append(E)
    rule = {e.name: e.tp for e in entries}
    tied = {e.name for e in entries if e.name.startswith("tied_modules.")}
    full = Values(entries, dtype, case["stage"], seed)
    full.moments = tp_moments(full, entries)
    client = tp_client_state(case, pp_tp_universal_info(case))
    stage_names, ranks = [], {}  # ranks[(s, t)] = that rank's Universal
    for s, lids in enumerate(stages):
        # PipelineModule registers tied_modules before the numbered layers: named_parameters() (hence the
        # param groups and param_shapes) lists the tied embedding first on both stages
        names = [e.name for e in entries if e.name in tied] if s in (0, pp - 1) else []  # first and last stage
        names += [pre + k for li, pre, keys in layers if li in lids and not pre.startswith("tied_modules.")
                  for k, _, _ in keys]
        stage_names.append(names)
        s_entries, s_vals = pp_tp_stage_values(full, entries, set(names), tied, perturb=s > 0)
        s_entries = sorted(s_entries, key=lambda e: names.index(e.name))
        for t in range(tp):
            m = s * tp + t
            ents, vals = tp_rank_model(s_entries, s_vals, t, tp)
            ranks[(s, t)] = Universal()
            module = write_zero012(case, tagdir, ents, vals, ranks[(s, t)], mp=m, client=client)
            for li, pre, keys in layers:
                if li in lids:
                    save(OD((k, module[pre + k].clone()) for k, _, _ in keys),
                         os.path.join(tagdir, f"layer_{li:02d}-model_{t:02d}-model_states.pt"))
            tp_check_rank(ranks[(s, t)], s_vals, rule, t, tp)
    uni.form, uni.optimizer_state = "dict", ranks[(0, 0)].optimizer_state  # ds_to_universal: (pp 0, tp 0, dp 0)
    uni.copies = [f"mp_rank_{m:02d}_model_states.pt" for m in range(pp * tp)]
    uni.merge_keys = OD()
    fp32 = OD()
    for s in range(pp):
        for n, d in ranks[(s, 0)].params.items():  # TP rank 0's param_shapes order, stage by stage
            if n in uni.params:
                assert s > 0 and n in tied, n  # the tied embedding: from the first stage
                continue
            rows = TP_VOCAB if rule[n] == "vocab" else None
            uni.params[n] = OD((k, (full.master[n] if k == "fp32" else full.moments[n][k])[:rows].clone())
                               for k in ("fp32", "exp_avg", "exp_avg_sq"))
            uni.params[n]["step"] = d["step"]
            uni.merge_keys[n] = TP_MERGE_KEYS[rule[n]]
            fp32[n] = full.master[n].clone()
    model = OD((pre + k, full.bit16(pre + k, dtype)) for _, pre, keys in layers for k, _, _ in keys)
    return fp32, model


# ----------------------------------------------------------------------------------------------------
# cases

# ----------------------------------------------------------------------------------------------------
# Mixture of Experts (deepspeed.moe.layer.MoE, expert parallelism), as DeepSpeed's engine saves it
# (engine._save_moe_checkpoint, v0.19.5 cf443004; same layout since the layer_{L}_expert_{E} names): `module`
# without experts; one layer_{moe layer}_expert_{global id}_mp_rank_00_model_states.pt per expert holding
# {global key: bit16 tensor}; the optimizer param groups of moe/utils.py
# split_params_into_different_moe_groups_for_optimizer (the original groups less their expert params, then
# per original group one {'moe': True, 'name': 'ep_size_<ep>'} group of the rank's LOCAL experts, local ids
# in their names).  ZeRO-1/2 (stage_1_and_2.py _configure_moe_settings): dense groups partitioned over all W
# ranks, expert groups over the rank's expert data-parallel group (utils/groups.py
# _create_expert_and_data_parallel: E + D puts EP rank e on ranks e, e + ep, ...; D + E,
# use_data_before_expert_parallel_, on e * edp .. e * edp + edp - 1); param_shapes (rank 0 = EP rank 0) lists
# the local names.  Without ZeRO: expp_rank_{ep}_mp_rank_00_optim_states.pt = {'optimizer': that EP rank's
# optimizer.state_dict()}.

MOE_MARK = ".deepspeed_moe.experts.deepspeed_experts."


def moe_layers(case):
    """[(module prefix, experts, residual)]: blocks.1.moe plain, blocks.2.moe with use_residual (its mlp and
    coefficient follow the experts in module order)."""
    return [("blocks.1.moe", case["experts"][0], False), ("blocks.2.moe", case["experts"][1], True)]


def moe_entries(case):
    """The full model's state_dict (module order, experts under global ids); e.expert = (layer, global id)."""
    E = [Entry("logit_scale", "train", (3,), group=1), Entry("mix", "buffer", (HIDDEN,), btype="float"),
         Entry("embed.weight", "train", (VOCAB, HIDDEN), group=0)]
    E += [Entry("blocks.0.ln.weight", "train", (HIDDEN,), group=1), Entry("blocks.0.ln.bias", "train", (HIDDEN,), group=1),
          Entry("blocks.0.fc1.weight", "train", (FFN, HIDDEN), group=0), Entry("blocks.0.fc1.bias", "train", (FFN,), group=1)]
    mlp = [("fc1.weight", (FFN, HIDDEN), 0), ("fc1.bias", (FFN,), 1), ("fc2.weight", (HIDDEN, FFN), 0),
           ("fc2.bias", (HIDDEN,), 1)]
    for layer, (prefix, n, residual) in enumerate(moe_layers(case)):
        E.append(Entry(f"{prefix}.deepspeed_moe.gate.wg.weight", "train", (n, HIDDEN), group=0))
        for x in range(n):
            for key, shape, g in mlp:
                # case "frozen_expert": the second layer's fc2.bias frozen in every expert
                frozen = case.get("frozen_expert") and residual and key == "fc2.bias"
                e = Entry(f"{prefix}{MOE_MARK}{x}.{key}", "frozen" if frozen else "train", shape, group=g)
                e.expert = (layer, x)
                E.append(e)
        if residual:
            E += [Entry(f"{prefix}.mlp.{k}", "train", s, group=g) for k, s, g in mlp]
            E += [Entry(f"{prefix}.coefficient.weight", "train", (2, HIDDEN), group=0),
                  Entry(f"{prefix}.coefficient.bias", "train", (2,), group=1)]
    E += [Entry("ln_f.weight", "train", (HIDDEN,), group=1), Entry("ln_f.bias", "train", (HIDDEN,), group=1),
          Entry("head.weight", "train", (VOCAB, HIDDEN), group=0)]
    for e in E:
        if not hasattr(e, "expert"):
            e.expert = None
        # rounding / overflow / subnormal values in a dense and in an expert parameter
        e.special = e.name in ("ln_f.bias", f"blocks.1.moe{MOE_MARK}1.fc2.bias")
    return E


def moe_local(e, ep, case):
    """Entry ``e`` of EP rank ``ep``'s local experts under its local name, else None."""
    layer, x = e.expert
    local = case["experts"][layer] // case["ep"]
    if x // local != ep:
        return None
    head, rest = e.name.split(MOE_MARK)
    out = Entry(f"{head}{MOE_MARK}{x % local}{rest[rest.index('.'):]}", "train", e.shape, group=e.group)
    out.values_name = e.name
    return out


def moe_groups(case, entries, ep):
    """EP rank ``ep``'s optimizer groups: [(entries for values (global names), entries as named there)] for
    the dense decay / no-decay groups, then the expert decay / no-decay groups."""
    dense = [[e for e in entries if e.kind == "train" and e.expert is None and e.group == g] for g in (0, 1)]
    out = [(g, g) for g in dense]
    for g in (0, 1):
        local = [(e, moe_local(e, ep, case)) for e in entries if e.kind == "train" and e.expert and e.group == g]
        local = [(e, l) for e, l in local if l is not None]
        out.append(([e for e, _ in local], [l for _, l in local]))
    return out


def moe_param_groups(n_dense, n_moe, ids, ep_size):
    pgs = [param_group_dict(g, ids[g], 0.01 if g == 0 else 0.0) for g in range(n_dense)]
    for g in range(n_moe):
        pg = param_group_dict(g, ids[n_dense + g], 0.01 if g == 0 else 0.0)
        pgs.append({"name": f"ep_size_{ep_size}", "moe": True, **pg})
    return pgs


def moe_ranks(case, ep):
    """Global ranks of EP rank ``ep``'s expert data-parallel group, in partition order."""
    W, EP = case["dp"], case["ep"]
    edp = W // EP
    if case.get("data_before_expert"):
        return [ep * edp + k for k in range(edp)]
    return [ep + k * EP for k in range(edp)]


def write_moe(case, tagdir, seed):
    """Writes a MoE tag; returns (fp32, model) as ckptfs serves them."""
    W, EP, dtn = case["dp"], case["ep"], case["dtype"]
    dtype = DTYPES[dtn]
    if case.get("data_before_expert"):
        case["ds_config"]["use_data_before_expert_parallel_"] = True
    entries = moe_entries(case)
    values = Values(entries, dtype, case["stage"], seed)
    rng = values.rng
    full = OD()  # the whole model as the ranks hold it: name -> bit16 (buffers and frozen params as they are)
    for e in entries:
        full[e.name] = values.buffers[e.name].clone() if e.kind == "buffer" else \
            values.frozen[e.name].clone() if e.kind == "frozen" else values.bit16(e.name, dtype)
    for e in entries:
        if e.expert:
            layer, x = e.expert
            path = os.path.join(tagdir, f"layer_{layer}_expert_{x}_mp_rank_00_model_states.pt")
            sd = torch.load(path, weights_only=True) if os.path.exists(path) else {}
            sd[e.name] = full[e.name].clone()  # _save_moe_checkpoint: clone().detach() of each expert tensor
            save(sd, path)
    buffer_names = [e.name for e in entries if e.kind == "buffer"]
    groups0 = moe_groups(case, entries, 0)
    if case["stage"] == 0 and case["optimizer"] == "fp16_unfused":
        # bf16 without ZeRO (DeepSpeed >= 0.17.6): FP16_UnfusedOptimizer; expp_rank_{ep} holds EP rank ep's
        # state_dict, fp32_groups per group (dense decay / no-decay, then its local experts' ones) the fp32
        # masters of its trainable params in group order; mp_rank_00's optimizer is rank 0's
        def state_dict(ep):
            groups = [vals for vals, _ in moe_groups(case, entries, ep)]
            return unfused_optimizer_state(groups, values, lambda ids: moe_param_groups(2, 2, ids, EP))
    elif case["stage"] == 0:
        # fp32, torch Adam: every param is its own master; expp_rank_{ep} = {'optimizer': EP rank ep's state_dict}
        def state_dict(ep):
            idx, state, ids = 0, {}, []
            for vals, _ in moe_groups(case, entries, ep):
                ids.append(list(range(idx, idx + len(vals))))
                for e in vals:
                    state[idx] = adam_state(rng, e.numel)
                    idx += 1
            return {"state": state, "param_groups": moe_param_groups(2, 2, ids, EP)}
    if case["stage"] == 0:
        module = OD((k, v.clone()) for k, v in full.items() if MOE_MARK not in k)
        states = [state_dict(ep) for ep in range(EP)]
        sd = model_state_dict(case, module, buffer_names, states[0], None, None, None, None, W)
        sd["num_experts"] = list(case["experts"])
        save(sd, os.path.join(tagdir, "mp_rank_00_model_states.pt"))
        for ep in range(EP):
            save({"optimizer": states[ep]}, os.path.join(tagdir, f"expp_rank_{ep}_mp_rank_00_optim_states.pt"))
        if case["optimizer"] == "torch":
            fp32 = OD((k, v.float() if v.is_floating_point() else v.clone()) for k, v in full.items())
        else:  # buffers, frozen params (module order), then every master in module order
            fp32 = moe_fp32(entries, values, full, [e for e in entries if e.kind == "frozen"], buffers=True)
        return fp32, OD((k, v.clone()) for k, v in full.items())

    # ZeRO-1/2: per EP rank and group, the flat masters padded to 2 x (partition group size)
    per_rank = {r: {"parts": [], "pad": [], "maps": [], "state": {}} for r in range(W)}
    module_views = {}
    for ep in range(EP):
        for gi, (vals, named) in enumerate(moe_groups(case, entries, ep)):
            expert = gi >= 2
            if not expert and ep > 0:
                continue  # dense groups: one flat buffer over all W ranks
            ranks = moe_ranks(case, ep) if expert else list(range(W))
            n = len(ranks)
            S = sum(e.numel for e in vals)
            A = 2 * n * math.ceil(S / (2 * n))
            Q = A // n
            mflat = master_flat(vals, values, A, rng)
            if not expert:
                _, views = flat_group(vals, values, dtype, 2 * n, rng)
                module_views.update(views)
            for k, r in enumerate(ranks):
                pad = (A - S) if k == n - 1 else 0
                part = mflat[k * Q: (k + 1) * Q].clone()
                per_rank[r]["parts"].append((gi, part[: Q - pad]))
                per_rank[r]["pad"].append((gi, pad))
                per_rank[r]["maps"].append((gi, slice_mappings(named, k, Q)))
                per_rank[r]["state"][gi] = adam_state(rng, Q)
    dense_entries = [e for e in entries if e.expert is None]
    module = build_module(dense_entries, values, dtype, module_views)
    shapes = [shapes_od(named) for _, named in groups0]
    # ZeRO-2 saves the frozen params of rank 0's module (_get_zero_frozen_param_attributes): EP rank 0's
    # experts, whose local ids are their global ids; the other EP ranks' frozen experts are only in expert files
    frozen0 = [e for e in entries if e.kind == "frozen" and (e.expert is None or moe_local(e, 0, case))]
    if case["stage"] == 2:
        frozen_shapes, frozen_frags = shapes_od(frozen0), OD((e.name, full[e.name].clone()) for e in frozen0)
    else:
        frozen_shapes, frozen_frags = None, None
    sd = model_state_dict(case, module, buffer_names, None, shapes, frozen_shapes, {}, frozen_frags, W)
    sd["num_experts"] = list(case["experts"])
    if case.get("legacy_states"):
        # DeepSpeed <= 0.19.2 (_save_moe_checkpoint's own dict): no buffer_names, param_shapes, frozen params,
        # ds_config; every EP rank's expert-DP writer saves expp_rank_<ep> with optimizer None under ZeRO
        keep = ("module", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
                "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "num_experts")
        client = ("fixture_case", "my_epoch", "my_float", "my_list", "my_tensor")
        sd = {**{k: sd[k] for k in keep}, "ds_autoep_layers": None, **{k: sd[k] for k in client}}
        for ep in range(EP):
            save({"optimizer": None}, os.path.join(tagdir, f"expp_rank_{ep}_mp_rank_00_optim_states.pt"))
    save(sd, os.path.join(tagdir, "mp_rank_00_model_states.pt"))
    prefix = "bf16_" if dtn == "bf16" else ""
    edp = W // EP
    for r in range(W):
        pr = per_rank[r]
        ordered = lambda items: [v for _, v in sorted(items, key=lambda t: t[0])]  # noqa: E731
        base = {"state": pr["state"], "param_groups": moe_param_groups(2, 2, [[g] for g in range(4)], EP)}
        osd = {"loss_scaler": loss_scaler(dtn), "dynamic_loss_scale": dtn == "fp16", "overflow": False,
               "clip_grad": 1.0, "base_optimizer_state": base, "single_partition_of_fp32_groups": ordered(pr["parts"]),
               "zero_stage": DS.ZeroStageEnum(case["stage"]), "group_paddings": ordered(pr["pad"]),
               "partition_count": [W, W, edp, edp], "ds_version": DS_VERSION, "param_slice_mappings": ordered(pr["maps"])}
        save({"optimizer_state_dict": osd, "ds_config": case["ds_config"], "ds_version": DS_VERSION},
             os.path.join(tagdir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    # ckptfs's order: buffers, frozen params (ZeRO-2: those saved with rank 0 first, then the other experts'
    # from their files; ZeRO-0/1: module order), then every trainable master in module order (experts by
    # global id)
    frozen = [e for e in entries if e.kind == "frozen"]
    if case.get("legacy_states"):  # no buffer_names: buffers and frozen params alike, in module order
        frozen = [e for e in entries if e.kind != "train"]
    elif case["stage"] == 2:
        frozen = frozen0 + [e for e in frozen if e not in frozen0]
    fp32 = moe_fp32(entries, values, full, frozen, buffers=not case.get("legacy_states"))
    return fp32, OD((k, v.clone()) for k, v in full.items())


def moe_fp32(entries, values, full, frozen, buffers):
    """The expected fp32/ of a MoE tag: the buffers (when listed apart), ``frozen`` upcast, then every
    trainable master (the generator's fp32 values) in module order."""
    fp32 = OD((e.name, values.buffers[e.name].float()) for e in entries if buffers and e.kind == "buffer")
    fp32.update((e.name, full[e.name].float()) for e in frozen)
    fp32.update((e.name, values.master[e.name].clone()) for e in entries if e.kind == "train")
    return fp32


def moe_cases():
    """MoE (only with --only; test_deepspeed_moe.py): two MoE layers (4 and 2 experts, the second with a
    residual MLP; with ``frozen_expert`` its experts' fc2.bias frozen) over EP 2: ZeRO-2 bf16 on 4 ranks (expert groups partitioned over EDP 2, E + D),
    ZeRO-1 fp16 on 4 ranks with use_data_before_expert_parallel_ (D + E), ZeRO-2 bf16 EP 4 = W (EDP 1,
    4 and 8 experts), ZeRO-2 with the model states of DeepSpeed <= 0.19.2 (``legacy_states``: no
    param_shapes / buffer_names / ds_config, expp_rank files holding optimizer None), and no ZeRO on 2 ranks
    (expp_rank files): fp32 with torch Adam, and bf16 with FP16_UnfusedOptimizer (fp32_groups, masters that
    are not the bf16 weights upcast)."""
    base = {"pipeline": False, "tags": ["global_step3"], "src": "checkpoint", "side_files": False, "moe": True}
    return [dict(base, name="moe_ep2_z2_bf16_dp4", stage=2, dtype="bf16", dp=4, ep=2, experts=[4, 2], optimizer="zero",
                 frozen_expert=True),
            dict(base, name="moe_ep2_z1_fp16_dp4_de", stage=1, dtype="fp16", dp=4, ep=2, experts=[4, 2],
                 optimizer="zero", data_before_expert=True, frozen_expert=True),
            dict(base, name="moe_ep4_z2_bf16_dp4", stage=2, dtype="bf16", dp=4, ep=4, experts=[4, 8], optimizer="zero"),
            dict(base, name="moe_ep2_z2_bf16_dp4_legacy", stage=2, dtype="bf16", dp=4, ep=2, experts=[4, 2],
                 optimizer="zero", frozen_expert=True, legacy_states=True),
            dict(base, name="moe_ep2_z0_fp32_dp2", stage=0, dtype="fp32", dp=2, ep=2, experts=[4, 2], optimizer="torch"),
            dict(base, name="moe_ep2_z0_bf16_dp2", stage=0, dtype="bf16", dp=2, ep=2, experts=[4, 2],
                 optimizer="fp16_unfused", frozen_expert=True)]


def make_cases():
    cases = []

    def add(name, stage, dtype, dp, optimizer, **kw):
        c = {"name": name, "stage": stage, "dtype": dtype, "dp": dp, "optimizer": optimizer, "pipeline": False,
             "tags": ["global_step3"], "src": "checkpoint", "side_files": False}
        c.update(kw)
        cases.append(c)

    for dp in (1, 2):
        add(f"z0_fp32_dp{dp}", 0, "fp32", dp, "torch")
        add(f"z0_fp16_dp{dp}", 0, "fp16", dp, "fp16_optimizer")
        add(f"z0_bf16_dp{dp}", 0, "bf16", dp, "bf16_optimizer", side_files=(dp == 2))
    for stage in (1, 2, 3):
        for dt in ("fp32", "fp16", "bf16"):
            for dp in (1, 2, 4, 8):
                add(f"z{stage}_{dt}_dp{dp}", stage, dt, dp, "zero",
                    side_files=(dp == 2 and dt == "bf16"))
    # one rank (HF Trainer on one GPU): both param groups have an odd number of elements, so the saved
    # partitions carry BF16_Optimizer's alignment padding
    add("bf16opt_z1_dp1", 1, "bf16", 1, "bf16_optimizer")
    add("bf16opt_z1_dp4", 1, "bf16", 4, "bf16_optimizer")
    add("pp2_z1_fp16_dp2", 1, "fp16", 2, "zero", pipeline=True, side_files=True)
    # DeepSpeed 0.19.5 layouts (like mount_tests/fixtures/deepspeed-0.19-real): ZeRO-0 + bf16 trains with
    # FP16_UnfusedOptimizer (masters in the model file's optimizer['fp32_groups'], two param groups); a
    # pipeline's ZeRO-0 BF16_Optimizer saves no param_shapes and its state in the model files as well
    v019 = {"ds_version": "0.19.5"}
    add("z0_bf16_unfused_dp2", 0, "bf16", 2, "fp16_unfused", model="tiny_lm_unfused",
        parallel_dimensions={"pp_degree": 1, "tp_degree": 1}, **v019)
    add("pp2_bf16opt_z0_dp1", 0, "bf16", 1, "bf16_optimizer", pipeline=True,
        parallel_dimensions={"pp_degree": 2, "tp_degree": 1}, **v019)
    add("twotags_z2_bf16_dp2", 2, "bf16", 2, "zero", tags=["global_step2", "global_step4"])
    # round_robin_gradients: params flattened (and param_shapes listed) in round-robin order, while the
    # param_slice_mappings DeepSpeed writes describe the original order (ds_to_universal mislabels them)
    add("rr_z2_bf16_dp4", 2, "bf16", 4, "zero", round_robin=True)
    add("tagsrc_z3_bf16_dp2", 3, "bf16", 2, "zero", src="checkpoint/global_step3")
    add("llama_z3_bf16_dp2", 3, "bf16", 2, "zero", side_files=True, model="llama")
    return cases


def scale_cases():
    """Many files: one 1,024-rank ZeRO-3 tag (2,048 files), and 12 tags of a 64-rank ZeRO-3 run (1,536
    files). Mounted and exported under `ulimit -n 1024` by test_scale.py; not in the default list.
    scale_z3_dp8/64/512: the same tiny model at 8, 64 and 512 ranks, the rank sweep of
    bench/scale_bench.sh (with scale_z3_dp1024)."""
    base = {"stage": 3, "dtype": "bf16", "optimizer": "zero", "pipeline": False, "src": "checkpoint",
            "side_files": False}
    return [dict(base, name="scale_z3_dp1024", dp=1024, tags=["global_step3"]),
            dict(base, name="scale_12tags_z3_dp64", dp=64, tags=[f"global_step{i}" for i in range(1, 13)])] + \
        [dict(base, name=f"scale_z3_dp{dp}", dp=dp, tags=["global_step3"]) for dp in SCALE_RANKS]


def many_params_cases():
    """ZeRO-2, DP 2, bf16, 20,480 small trainable params: 81,922 files under universal/<tag>_universal/.
    Used by test_universal.py (scale test) and a universal/ benchmark; not in the default list.
    many_params_100k_z2_dp2: the same with 100,000 trainable params (100,003 tensors in the catalog,
    400,002 files under universal/), the tensor-count point of bench/scale_bench.sh."""
    base = {"stage": 2, "dtype": "bf16", "dp": 2, "optimizer": "zero", "pipeline": False,
            "tags": ["global_step3"], "src": "checkpoint", "side_files": False, "model": "many_params"}
    return [{"name": "many_params_z2_dp2", **base},
            {"name": "many_params_100k_z2_dp2", **base, "n_train": MANY_PARAMS_100K}]


def tp_cases():
    """Megatron-DeepSpeed GPT with tensor parallelism (only with --only; test_deepspeed_tp.py):
    TP 2 ZeRO-1 bf16 DP 2 SwiGLU, TP 2 ZeRO-2 fp16 DP 2 GeLU with two frozen params (a replicated and a
    column-parallel one), TP 4 BF16_Optimizer (ZeRO-0) DP 1 SwiGLU; pipeline + TP: GPTModelPipe PP 2 x TP 2,
    ZeRO-1 bf16 DP 2 SwiGLU, embedding tied over the first and last stage (write_pipeline_tensor_parallel);
    fused GQA query_key_value ('parameter_with_sub_params', version 0.4): TP 2 ZeRO-1 bf16 DP 2 SwiGLU with
    q 4 / kv 2 heads of 4 (rows 16 + 8 + 8, widths [[8, 8], [4, 4], [4, 4]], AutoTP-style entries) and TP 2
    BF16_Optimizer DP 2 GeLU with q 6 / kv 3 heads of 4 (rows 24 + 12 + 12, uneven widths [[16, 8], [8, 4],
    [8, 4]], Megatron-style patterns, layer 1's qkv bias frozen)."""
    base = {"pipeline": False, "tags": ["global_step3"], "src": "checkpoint", "side_files": False}
    frozen = ["language_model.encoder.layers.1.input_layernorm.weight",
              "language_model.encoder.layers.1.self_attention.query_key_value.bias"]
    return [dict(base, name="tp2_z1_bf16_dp2_swiglu", stage=1, dtype="bf16", dp=2, optimizer="zero", tp=2,
                 swiglu=True),
            dict(base, name="tp2_z2_fp16_dp2_gelu_frozen", stage=2, dtype="fp16", dp=2, optimizer="zero", tp=2,
                 swiglu=False, frozen=frozen),
            dict(base, name="tp4_bf16opt_dp1_swiglu", stage=0, dtype="bf16", dp=1, optimizer="bf16_optimizer", tp=4,
                 swiglu=True),
            dict(base, name="pp2_tp2_z1_bf16_dp2", stage=1, dtype="bf16", dp=2, optimizer="zero", tp=2, pp=2,
                 swiglu=True, pipeline=True),
            dict(base, name="tp2_z1_bf16_dp2_gqa", stage=1, dtype="bf16", dp=2, optimizer="zero", tp=2,
                 swiglu=True, gqa={"q_heads": 4, "kv_heads": 2, "head_dim": 4, "style": "autotp"}),
            dict(base, name="tp2_bf16opt_dp2_gqa_uneven", stage=0, dtype="bf16", dp=2, optimizer="bf16_optimizer",
                 tp=2, swiglu=False, gqa={"q_heads": 6, "kv_heads": 3, "head_dim": 4, "style": "megatron"},
                 frozen=["language_model.encoder.layers.1.self_attention.query_key_value.bias"])]


# Wrapper prefixes (only with --only; mount_tests/test_prefixes.py generates them): the Llama of
# llama_z3_bf16_dp2 as training frameworks hand it to DeepSpeed, every name under the wrapper's prefix, in
# their own save dirs.  Their cache version is case_version's, so that changing them leaves the cache of
# the other cases valid.
PREFIX_GEN_VERSION = 1
LIGHTNING_CKPT = lightning_ckpt_path(0, 3)


def prefix_cases():
    """Lightning's DeepSpeedStrategy: save_checkpoint(filepath, client_state=<the Lightning checkpoint less
    state_dict and optimizer_states>, tag="checkpoint") (lightning/pytorch/strategies/deepspeed.py
    save_checkpoint), so ModelCheckpoint's `epoch=0-step=3.ckpt` is a save dir holding `latest`
    ("checkpoint") and the tag dir `checkpoint/`.  The engine's module is the LightningModule (>= 2.1;
    the HF model held as `self.model`: prefix `model.`), `_LightningModuleWrapperBase(forward_module=...)`
    in 1.8-2.0 (`_forward_module.model.`), `LightningDeepSpeedModule` (its `module`) up to 1.7
    (`module.model.`).  config.json (LlamaForCausalLM) and tokenizer.json in the save dir.
    OpenRLHF's PPO actor: DeepSpeed gets the HF model itself (openrlhf/utils/deepspeed/deepspeed.py:
    `raw_model = model.model if isinstance(model, Actor)`, `deepspeed.initialize(model=raw_model)`): plain HF
    names, no prefix; save_ckpt(actor engine, <ckpt.path>/_actor, tag=global_step<N>) with `metric.json` in
    the tag dir, and save_model's <ckpt.path>/global_step<N>_hf/ (config.json, tokenizer) beside `_actor/`,
    none in the save dir."""
    base = {"pipeline": False, "dp": 2, "optimizer": "zero", "model": "llama", "side_files": True}
    lightning = dict(base, client="lightning", save_dir=LIGHTNING_CKPT, src=LIGHTNING_CKPT, tags=["checkpoint"])
    return [
        # Lightning >= 2.1, strategy="deepspeed_stage_2", precision="bf16-mixed"; the embedding frozen
        dict(lightning, name="lightning_z2_bf16_dp2", stage=2, dtype="bf16", prefix="model.",
             lightning_version="2.5.5", hf_frozen=["model.embed_tokens.weight"]),
        # Lightning 1.8-2.0, "deepspeed_stage_3"; lm_head tied to the embedding, the final norm frozen
        dict(lightning, name="lightning20_z3_bf16_dp2", stage=3, dtype="bf16", prefix="_forward_module.model.",
             lightning_version="2.0.9", tied=True, hf_frozen=["model.norm.weight"]),
        # Lightning <= 1.7, "deepspeed_stage_1", precision=16
        dict(lightning, name="lightning17_z1_fp16_dp2", stage=1, dtype="fp16", prefix="module.model.",
             lightning_version="1.7.7"),
        # OpenRLHF's actor (ZeRO-2, its default stage), two saves
        dict(base, name="openrlhf_z2_bf16_dp2", stage=2, dtype="bf16", prefix="", client="openrlhf",
             side_files=False, save_dir="ckpt/_actor", src="ckpt/_actor", tags=["global_step2", "global_step4"],
             hf_dir="ckpt/global_step4_hf"),
    ]


def case_version(case):
    """The generator_version a case's case.json carries (case_cache)."""
    return f"{GEN_VERSION}+prefix{PREFIX_GEN_VERSION}" if "prefix" in case else GEN_VERSION


def lightning_ds_config(stage, dtype_name):
    """DeepSpeedStrategy(stage=S)'s config (_create_default_config with its defaults, then
    _format_precision_config and _format_batch_size_and_grad_accum_config), as the engine saves it."""
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": stage, "contiguous_gradients": True, "overlap_comm": True,
                                 "allgather_partitions": True, "reduce_scatter": True,
                                 "allgather_bucket_size": 200000000, "reduce_bucket_size": 200000000,
                                 "sub_group_size": 1000000000000},
           "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                        "contiguous_memory_optimization": False,
                                        "synchronize_checkpoint_boundary": False},
           "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True,
                   "thread_count": 1}}
    if dtype_name == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    elif dtype_name == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(gradient_accumulation_steps=1, gradient_clipping=0.0)
    return cfg


def openrlhf_ds_config(stage, dtype_name):
    """openrlhf/utils/deepspeed/deepspeed_utils.py get_train_ds_config(offload=False, adam_offload=False), the
    optimizer section (DeepSpeed builds the optimizer) and the batch sizes the strategy adds."""
    return {"steps_per_print": 100,
            "zero_optimization": {"stage": stage, "offload_param": {"device": "none"},
                                  "offload_optimizer": {"device": "none", "pin_memory": True},
                                  "sub_group_size": "auto", "stage3_max_live_parameters": "auto",
                                  "stage3_max_reuse_distance": "auto", "stage3_param_persistence_threshold": "auto",
                                  "stage3_prefetch_bucket_size": "auto", "reduce_bucket_size": "auto",
                                  "zero_hpz_partition_size": 8, "zero_quantized_weights": False,
                                  "zero_quantized_gradients": False},
            "bf16": {"enabled": dtype_name == "bf16"}, "fp16": {"enabled": dtype_name == "fp16"},
            "gradient_clipping": 1.0, "prescale_gradients": False, "wall_clock_breakdown": False,
            "data_types": {"grad_accum_dtype": None}, "checkpoint": {"load_universal": False},
            "compile": {"deepcompile": False}, "tensor_parallel": {"autotp_size": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 5e-07, "betas": [0.9, 0.95], "eps": 1e-08,
                                                      "weight_decay": 0.0}},
            "train_micro_batch_size_per_gpu": 1, "train_batch_size": 8}


def lightning_client_state(case):
    """What DeepSpeedStrategy.save_checkpoint passes as client_state: the Lightning checkpoint less `state_dict`
    and `optimizer_states`."""
    return lightning_state(case["global_steps"], case["lightning_version"])


def openrlhf_client_state(case):
    """ppo_trainer.py's client_states for the actor's save_ckpt."""
    step = case["global_steps"]
    return {"episode": 0, "global_step": step, "total_consumed_prompts": 4 * step,
            "data_loader_state_dict": {"_iterator_finished": False, "_num_yielded": step}}


def write_openrlhf_files(root, tagdir, case, tag):
    """metric.json in the tag dir (DeepspeedStrategy._write_ckpt_metric, after save_checkpoint) and, for the
    last tag, save_model's <ckpt.path>/<tag>_hf/ with the config and tokenizer (its weights are not needed)."""
    with open(os.path.join(tagdir, "metric.json"), "w") as f:
        json.dump({"metric_key": None, "metric_value": None}, f, indent=2, sort_keys=True)
    if tag == case["tags"][-1]:
        hf = os.path.join(root, case["hf_dir"])
        os.makedirs(hf)
        write_llama_side_files(hf, case)


def unprefixed(case, state):
    """An expectation under the HF model's own names: the wrapper's prefix taken off every name."""
    p = case["prefix"]
    assert all(k.startswith(p) for k in state), f"a name without the prefix {p!r}"
    return OD((k[len(p):], v) for k, v in state.items())


BENCH = {"name": "bench_z3_dp64", "stage": 3, "dtype": "bf16", "dp": 64, "optimizer": "zero", "pipeline": False,
         "tags": ["global_step3"], "src": "checkpoint", "side_files": False, "bench": True}
# The bench model at a few MB (vocab, hidden, ffn, layers as in BENCH_DIMS): 8 rank files of 1.4 MB, the
# fp32 masters a third of each, for test_source_reads.py (not in the default list).
SOURCE_READS = dict(BENCH, name="source_reads_z3_dp8", dp=8, dims=(4099, 128, 515, 3))


def case_seed(name, tag):
    return zlib.crc32(f"{name}/{tag}".encode())


def write_side_files(save_dir, case):
    if case.get("model") == "llama":
        return write_llama_side_files(save_dir, case)
    with open(os.path.join(save_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["TinyLM"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
                   "intermediate_size": FFN, "torch_dtype": {"fp32": "float32", "fp16": "float16",
                                                             "bf16": "bfloat16"}[case["dtype"]]}, f, indent=2)
    with open(os.path.join(save_dir, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "WordLevel",
                                               "vocab": {f"tok{i}": i for i in range(VOCAB)}}}, f)


def write_llama_side_files(save_dir, case):
    """A config.json that transformers' AutoConfig / AutoModelForCausalLM accept, and a tokenizer.json."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **LLAMA,
           "hidden_act": "silu", "initializer_range": 0.02, "attention_bias": False, "attention_dropout": 0.0,
           "mlp_bias": False, "tie_word_embeddings": bool(case.get("tied")), "use_cache": True, "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": 0, "rope_scaling": None,
           "head_dim": LLAMA["hidden_size"] // LLAMA["num_attention_heads"],
           "torch_dtype": {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[case["dtype"]]}
    with open(os.path.join(save_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(save_dir, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "WordLevel", "unk_token": "<unk>",
                                               "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2,
                                                         **{f"tok{i}": i for i in range(3, LLAMA["vocab_size"])}}}},
                  f)


def generate_case(case, root):
    name = case["name"]
    save_dir = os.path.join(root, case.get("save_dir", "checkpoint"))
    os.makedirs(save_dir)
    case = dict(case)
    if case.get("client") == "lightning":
        case["ds_config"] = lightning_ds_config(case["stage"], case["dtype"])
    elif case.get("client") == "openrlhf":
        case["ds_config"] = openrlhf_ds_config(case["stage"], case["dtype"])
    else:
        case["ds_config"] = ds_config(case["stage"], case["dtype"], case["optimizer"] == "bf16_optimizer",
                                      case["pipeline"], case.get("round_robin", False))
    expected_dirs = {}
    universal = None
    for ti, tag in enumerate(case["tags"]):
        case["global_steps"] = int(tag.rsplit("step", 1)[-1]) if "step" in tag else 3
        tagdir = os.path.join(save_dir, tag)
        os.makedirs(tagdir)
        seed = case_seed(name, tag)
        uni = Universal() if has_universal(case) else None
        if case.get("moe"):
            fp32, model = write_moe(case, tagdir, seed)
        elif case["pipeline"] and case.get("tp", 1) > 1:
            fp32, model = write_pipeline_tensor_parallel(case, tagdir, seed, uni)
        elif case["pipeline"]:
            fp32, model = write_pipeline(case, tagdir, seed, uni)
        elif case.get("tp", 1) > 1:
            fp32, model = write_tensor_parallel(case, tagdir, seed, uni)
        else:
            entries = entries_of(case)
            values = Values(entries, DTYPES[case["dtype"]], case["stage"], seed)
            if case["stage"] == 3:
                write_zero3(case, tagdir, entries, values, uni)
                module = None
            else:
                module = write_zero012(case, tagdir, entries, values, uni)
            fp32, model = expected_outputs(case, entries, values, module)
            if "prefix" in case:  # what the HF model's state_dict() holds: its own names
                fp32, model = unprefixed(case, fp32), unprefixed(case, model)
        if case.get("client") == "openrlhf":
            write_openrlhf_files(root, tagdir, case, tag)
        exp = "expected" if ti == len(case["tags"]) - 1 else f"expected_{tag}"
        os.makedirs(os.path.join(root, exp))
        save(fp32, os.path.join(root, exp, "fp32.pt"))
        save(model, os.path.join(root, exp, "model.pt"))
        if uni is not None:
            uni.write(os.path.join(root, exp))
            universal = {"form": uni.form, "step": uni.form == "dict", "copies": uni.copies,
                         "params": len(uni.params),
                         "files": len(uni.params) * (4 if uni.form == "dict" else 3) + 1 + len(uni.copies),
                         "expected": "universal.pt", "optimizer_state": "universal_optimizer_state.pt"}
            if uni.merge_keys is not None:
                # tensor parallelism: per param, the keys (in order) its files hold before 'param'
                universal["merge_keys"] = uni.merge_keys
        expected_dirs[tag] = exp
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write(case["tags"][-1])  # DeepSpeed writes the tag without a newline
    if case["side_files"]:
        write_side_files(save_dir, case)
    case.pop("global_steps", None)
    case["latest"] = case["tags"][-1]
    case["expected"] = expected_dirs
    case["seed"] = {t: case_seed(name, t) for t in case["tags"]}
    # the universal/ tree ckptfs serves for every tag (null: no partitioned optimizer state, no universal/)
    case["universal"] = universal
    case["generator_version"] = case_version(case)
    with open(os.path.join(root, "case.json"), "w") as f:
        json.dump(case, f, indent=1)


# ----------------------------------------------------------------------------------------------------
# benchmark: ZeRO-3, DP 64, bf16 params + fp32 master, >= 1 GB of fp32 master weights.  Values are a
# closed-form function of (param index, element index) so that each rank's partitions are computed
# without holding the model; expectations are sha256 manifests computed one parameter at a time.

BENCH_DIMS = (32003, 1031, 4099, 28)  # vocab, hidden, ffn, layers


def bench_entries(dims):
    vocab, hidden, ffn, layers = dims
    E = [Entry("embed.weight", "train", (vocab, hidden), group=0, subgroup=0)]
    for l in range(layers):
        p = f"layers.{l}."
        sg = 1 + (l * 2) // layers  # decay group in 2 sub-groups after the embedding's
        E += [Entry(p + "norm.weight", "train", (hidden,), group=1, subgroup=3),
              Entry(p + "up.weight", "train", (ffn, hidden), group=0, subgroup=sg),
              Entry(p + "up.bias", "train", (ffn,), group=1, subgroup=3),
              Entry(p + "down.weight", "train", (hidden, ffn), group=0, subgroup=sg),
              Entry(p + "down.bias", "train", (hidden,), group=1, subgroup=3)]
    E += [Entry("norm.weight", "train", (hidden,), group=1, subgroup=3),
          Entry("inv_freq", "buffer", (hidden // 2,), btype="float"),
          Entry("head.weight", "alias", (vocab, hidden), owner="embed.weight")]
    return E


def bench_master(k, lo, hi):
    idx = np.arange(lo, hi, dtype=np.float64)
    return torch.from_numpy((np.sin(idx * 0.7548776662 + k * 1.3) * 0.02 * (1 + k % 7)).astype(np.float32))


def generate_bench(case, root):
    t0 = time.time()
    dp, dtype = case["dp"], torch.bfloat16
    dims = case.get("dims", BENCH_DIMS)
    hidden = dims[1]
    entries = bench_entries(dims)
    kidx = {e.name: k for k, e in enumerate(entries)}
    subgroups = groups_of(entries, "subgroup")
    groups = groups_of(entries, "group")
    pg_sub = [sorted({e.subgroup for e in g}) for g in groups]
    case = dict(case)
    case["ds_config"] = ds_config(3, "bf16")
    case["global_steps"] = 3
    save_dir = os.path.join(root, "checkpoint")
    tagdir = os.path.join(save_dir, "global_step3")
    os.makedirs(tagdir)
    rng = np.random.default_rng(64)
    inv_freq = torch.from_numpy(1.0 / (10000 ** (np.arange(0, hidden // 2) / (hidden // 2)))
                                .astype(np.float32)).to(dtype)
    for r in range(dp):
        module = OD()
        for e in entries:
            module[e.name] = inv_freq.clone() if e.kind == "buffer" else (
                module[e.owner] if e.kind == "alias" else torch.empty(0, dtype=dtype))
        sd = model_state_dict(case, module, ["inv_freq"], None, [shapes_od(sg) for sg in subgroups], OD(),
                              {"head.weight": "embed.weight"} if r == 0 else {}, OD(), dp)
        save(sd, os.path.join(tagdir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))
        flat_groups, state = [], {}
        for i, sg in enumerate(subgroups):
            parts = []
            for e in sg:
                p = math.ceil(e.numel / dp)
                lo, hi = r * p, min((r + 1) * p, e.numel)
                t = bench_master(kidx[e.name], lo, max(lo, hi))
                if t.numel() < p:
                    t = torch.cat([t, garbage(rng, p - t.numel(), torch.float32)])
                parts.append(t)
            flat_groups.append(torch.cat(parts))
            n = flat_groups[-1].numel()
            state[i] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}
        osd = {"zero_stage": DS.ZeroStageEnum.weights, "loss_scaler": DS.LossScaler(1.0), "dynamic_loss_scale": False,
               "overflow": False, "partition_count": dp,
               "optimizer_state_dict": {"state": state,
                                        "param_groups": [param_group_dict(j, pg_sub[j], 0.0) for j in range(len(groups))]},
               "fp32_flat_groups": flat_groups}
        save({"optimizer_state_dict": osd, "ds_config": case["ds_config"], "ds_version": DS_VERSION},
             os.path.join(tagdir, f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
        del flat_groups, state, osd
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write("global_step3")

    def digest(t):
        return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()

    fp32_man, model_man = OD(), OD()
    total = 0
    order_fp32 = [e for e in entries if e.kind == "buffer"] + [e for sg in subgroups for e in sg] + \
                 [e for e in entries if e.kind == "alias"]
    for e in order_fp32:
        if e.kind == "buffer":
            t = inv_freq.float()
        else:
            t = bench_master(kidx[e.owner if e.kind == "alias" else e.name], 0, e.numel).view(e.shape)
        total += t.numel() * 4 if e.kind == "train" else 0
        fp32_man[e.name] = {"dtype": "float32", "shape": list(t.shape), "sha256": digest(t)}
    for e in entries:
        if e.kind == "buffer":
            t = inv_freq
        else:
            t = bench_master(kidx[e.owner if e.kind == "alias" else e.name], 0, e.numel).view(e.shape).to(dtype)
        model_man[e.name] = {"dtype": "bfloat16", "shape": list(t.shape), "sha256": digest(t)}
    os.makedirs(os.path.join(root, "expected"))
    with open(os.path.join(root, "expected", "fp32.manifest.json"), "w") as f:
        json.dump(fp32_man, f, indent=1)
    with open(os.path.join(root, "expected", "model.manifest.json"), "w") as f:
        json.dump(model_man, f, indent=1)
    case.pop("global_steps")
    case.update(latest="global_step3", expected={"global_step3": "expected"}, fp32_master_bytes=total,
                generator_version=GEN_VERSION, generate_seconds=round(time.time() - t0, 1))
    with open(os.path.join(root, "case.json"), "w") as f:
        json.dump(case, f, indent=1)


# ----------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="generate only these cases (bench_z3_dp64, the scale, many_params, tp, moe and prefix "
                         "cases too)")
    ap.add_argument("--list", action="store_true", help="print the default case names and exit")
    ap.add_argument("--force", action="store_true", help="regenerate cases that exist")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cases = make_cases()
    if args.list:
        for c in cases:
            print(c["name"])
        return 0
    by_name = {c["name"]: c for c in cases}
    by_name[BENCH["name"]] = BENCH
    by_name[SOURCE_READS["name"]] = SOURCE_READS
    by_name.update((c["name"], c) for c in scale_cases())
    by_name.update((c["name"], c) for c in many_params_cases())
    by_name.update((c["name"], c) for c in tp_cases())
    by_name.update((c["name"], c) for c in moe_cases())
    by_name.update((c["name"], c) for c in prefix_cases())
    if args.only:
        unknown = [n for n in args.only if n not in by_name]
        if unknown:
            ap.error(f"unknown case(s): {', '.join(unknown)}")
        todo = [by_name[n] for n in args.only]
    else:
        todo = cases
    os.makedirs(args.out_dir, exist_ok=True)
    t0 = time.time()
    made = 0
    with generation_lock(args.out_dir):  # one generator at a time per folder (pytest-xdist workers)
        for c in todo:
            final = os.path.join(args.out_dir, c["name"])
            if os.path.isdir(final):
                if case_is_current(final, case_version(c)) and not args.force:
                    continue
                shutil.rmtree(final)
            tmp = os.path.join(args.out_dir, f".tmp-{c['name']}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            try:
                (generate_bench if c.get("bench") else generate_case)(c, tmp)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            made += 1
    print(f"generated {made} case(s) in {time.time() - t0:.1f}s into {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
