"""torch_dist (``--ckpt-format torch_dist``) cases: where every tensor goes in Megatron's dist-checkpointing
geometry, the per-rank plans the chroot writer turns into a real DCP dir, the host side of running that
writer in the Debian 13 chroot (torch 2.6), and the self-check of what it wrote
(Megatron-LM's dist-checkpointing conventions).

Geometry (world = TP x DP x PP, global rank = tp + TP * (dp + DP * pp), one gloo process per rank in the chroot;
each shard is written by one DP replica of its model-parallel domain, see saving_dp_ranks):
- layers are STACKED: ``decoder.layers.<rest>`` of global shape [L, ...]; a chunk is one layer of one TP
  rank: [1, rows/TP, H] (column, vocab), [1, H, cols/TP] (row), [1, ...] replicated (norms, row biases,
  saved by TP rank 0 only: replica dedup); gated fc1 (SwiGLU) as 2*TP chunks per layer, rank r writing its
  gate rows at fragment r and its up rows at fragment TP + r of the global [gate; up];
- TE names even for the local spec (``self_attention.linear_qkv.layer_norm_weight``,
  ``mlp.linear_fc1.layer_norm_weight``);
- ``embedding.word_embeddings.weight`` [Vp, H] in vocab chunks (first stage), ``embedding.position_embeddings
  .weight`` (learned_absolute), ``decoder.final_layernorm.*`` and, untied only, ``output_layer.weight``
  (last stage; the tied copy is a replica and not stored);
- non-distributed optimizer (bf16/fp16): ``optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key>`` with the
  model key's geometry;
- bytes items (ShardedObjects, torch.save([obj])): ``decoder.layers.<module>._extra_state/shard_{l}_{L}``
  (TP rank 0, DP rank 0 of the layer's stage) and ``rng_state/shard_{pp}.{tp}_{PP}.{TP}`` (DP rank 0 of every
  model-parallel domain);
- ``common.pt`` (args, checkpoint_version, iteration, optimizer param_groups, scheduler ...),
  ``metadata.json`` and the tracker, written here on the host; or (``common`` 'dcp', core 0.19+) that common
  state as the bytes item ``common_state/shard_0_1`` (torch.save([state]), rank 0), no common.pt, and
  metadata.json without the common_backend fields.
"""
import collections
import io
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile

import torch

from megatron_args import make_args
from megatron_layout import EXTRA_TE, bucket_size, chunk_layers, merged_entries, pack_buffer, rule_of

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.append(os.path.join(TESTS, "gen_dcp"))
import run_generator as RG  # noqa: E402  (the chroot: where it is, whether it is ready, how to enter it)

CHROOT_SCRIPT = os.path.join(HERE, "chroot_megatron_dist.py")
METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                 "common_backend_version": 1}
METADATA_JSON_019 = {"sharded_backend": "torch_dist", "sharded_backend_version": 1}  # core 0.19+: no common.pt
COMMON_STATE = "common_state/shard_0_1"  # ShardedObject('common_state', global shape (1,), offset (0,))
PLANS = ".plans"  # per case: .plans/<tag>/rank<r>.pt while the case is being made
LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
TE_NAMES = (("input_layernorm.", "self_attention.linear_qkv.layer_norm_"),
            ("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"))
TIMEOUT = 600


def dist_key(rest):
    """The torch_dist name of a layer module path (local-spec norms get their TE names)."""
    for local, te in TE_NAMES:
        if rest.startswith(local):
            return te + rest[len(local):]
    return rest


def tp_pieces(rule, full, t, tp):
    """[(offsets, piece)] that TP rank t saves of a full (TP=1 layout) tensor."""
    zeros = (0,) * full.ndim
    if rule == "rep":
        return [(zeros, full)] if t == 0 else []
    n = full.shape[0] // tp
    if rule in ("vocab", "col", "qkv"):  # QKV: a rank's group block is a contiguous row range
        return [((t * n,) + zeros[1:], full[t * n:(t + 1) * n])]
    if rule == "row":
        m = full.shape[1] // tp
        return [((0, t * m) + zeros[2:], full[:, t * m:(t + 1) * m])]
    if rule == "glu":
        F = full.shape[0] // 2
        m = F // tp
        return [((o + t * m,) + zeros[1:], full[o + t * m:o + (t + 1) * m]) for o in (0, F)]
    raise ValueError(rule)


def layout(case):
    """[(key, global shape, src, layer or None, owner stage)] of the model tensors, in state-dict order,
    and [(object key, extra kind, layer, stage)] of the layers' ``_extra_state``."""
    assert case["vp"] == 1 and not case["experts"], "torch_dist cases: no VP, no MoE"
    stage_of = {g: p for (p, _), ls in chunk_layers(case).items() for g in ls}
    L, last = case["layers"], case["pp"] - 1
    tensors, objects = [], []
    for e in merged_entries(case):
        m = LAYER.match(e.name)
        if m:
            g = int(m.group(1))
            key = "decoder.layers." + dist_key(m.group(2))
            if e.is_param:
                tensors.append((key, g, e.src, stage_of[g]))
            else:
                objects.append((f"{key}/shard_{g}_{L}", e.extra, g, stage_of[g]))
        elif e.is_param and not e.copy:
            tensors.append((e.name, None, e.src, 0 if e.name.startswith("embedding.") else last))
    return tensors, objects


def global_rank(case, t, d, p):
    """The global rank of TP rank t, DP rank d, PP rank p in Megatron's default order 'tp-cp-ep-dp-pp'
    (parallel_state.RankGenerator: TP varies fastest, then DP, then PP); it names the rank's __<rank>_0.distcp."""
    return t + case["tp"] * (d + case["dp"] * p)


def write_plans(case, vals, iteration, iter_dir, seed, gen):
    """Writes common.pt, metadata.json and the per-rank plans (``.plans/<tag>/rank<r>.pt``: {'keys': [(key,
    global shape)] every rank declares, 'tensors': {key: [(offsets, chunk)]}, 'objects': [(key, [obj])]},
    a bytes item being torch.save of its value, as Megatron's ShardedObjects are saved)
    of one iteration, for world = TP x DP x PP ranks.  Which DP replica writes each shard follows Megatron's
    fully parallel save (``saving_dp_ranks``); ShardedObjects are written by DP rank 0 of their domain.
    ``gen``: the generate module (values, rng and optimizer helpers)."""
    tp, pp, dp, dt = case["tp"], case["pp"], case["dp"], case["dtype"]
    with_optim = case["optimizer"] and dt != "fp32"
    assert case["optimizer"] is False or dt != "fp32", "torch_dist fp32 cases: no optimizer"
    tensors, objects = layout(case)
    keys = []  # [(key, global shape)] in state-dict order, declared by every rank
    shards = collections.defaultdict(list)  # (pp, tp) -> [(key, offsets, chunk, DP rank holding it or None: all)]
    domain_objects = collections.defaultdict(list)  # (pp, tp) -> [(key, [obj])], written by DP rank 0
    for key, kind, g, stage in objects:  # _extra_state: TP rank 0 of the layer's stage
        domain_objects[(stage, 0)].append((key, [torch.empty(0, dtype=torch.uint8) if kind == EXTRA_TE else None]))

    def declare(key, g, stage, rule, full):
        keys.append((key, tuple(full.shape) if g is None else (case["layers"],) + tuple(full.shape)))
        for t in range(tp):
            for off, piece in tp_pieces(rule, full, t, tp):
                if g is not None:
                    off, piece = (g,) + off, piece.unsqueeze(0)
                shards[(stage, t)].append((key, off, piece.contiguous().clone(), None))

    for key, g, src, stage in tensors:
        declare(key, g, stage, rule_of(case, src), gen.to_torch(vals.model[src], dt))
    if with_optim and case["dist_opt"] and case["dist_optim_sharding"] == "dp_reshardable":
        declare_buckets(case, vals, keys, shards, domain_objects, gen)
    elif with_optim and case["dist_opt"] and case["dist_optim_sharding"] == "fully_sharded_model_space":
        declare_flattened_masters(case, vals, tensors, keys, shards, gen)
    elif with_optim and case["dist_opt"]:
        assert case["dist_optim_sharding"] == "dp_zero_gather_scatter", case["dist_optim_sharding"]
        declare_param_state(case, vals, domain_objects, gen)
    elif with_optim:
        for key, g, src, stage in tensors:
            master = vals.master[src]
            ea, eas = gen.adam_moments(vals.rng, master.shape)
            for kind, a in (("fp32_param", master), ("exp_avg", ea), ("exp_avg_sq", eas)):
                declare(f"optimizer.state.{kind}.{key}", g, stage, rule_of(case, src), torch.from_numpy(a.copy()))
    seen = set()  # a stacked key comes once per layer: declare it once
    keys = [k for k in keys if not (k[0] in seen or seen.add(k[0]))]
    plans = {r: {"keys": keys, "tensors": collections.defaultdict(list), "objects": []} for r in range(tp * dp * pp)}
    for (p, t), domain in shards.items():
        for (key, off, piece, _), d in zip(domain, saving_dp_ranks(domain, dp)):
            plans[global_rank(case, t, d, p)]["tensors"][key].append((off, piece))
    if case["optimizer"]:
        for p, t in itertools.product(range(pp), range(tp)):
            domain_objects[(p, t)].append((f"rng_state/shard_{p}.{t}_{pp}.{tp}", [gen.rng_state(seed + 1 + p * tp + t)]))
    for (p, t), objs in sorted(domain_objects.items()):
        plans[global_rank(case, t, 0, p)]["objects"] += objs
    common = common_state(case, iteration, with_optim, gen)
    if case["common"] == "dcp":
        plans[0]["objects"].append((COMMON_STATE, [common]))  # replica_id = rank: rank 0's is saved
    tag = os.path.basename(iter_dir)
    plan_dir = os.path.join(os.path.dirname(os.path.dirname(iter_dir)), PLANS, tag)
    os.makedirs(plan_dir)
    for r, plan in plans.items():
        plan["tensors"] = dict(plan["tensors"])
        torch.save(plan, os.path.join(plan_dir, f"rank{r}.pt"))
    os.makedirs(iter_dir)
    if case["common"] == "file":
        torch.save(common, os.path.join(iter_dir, "common.pt"))
    else:
        assert case["common"] == "dcp", case["common"]
    with open(os.path.join(iter_dir, "metadata.json"), "w") as f:
        json.dump(METADATA_JSON if case["common"] == "file" else METADATA_JSON_019, f)


def saving_dp_ranks(shards, dp):
    """The DP rank that writes each shard of one model-parallel domain ([(key, offsets, chunk, holder)], holder None:
    every DP replica holds it), as megatron-core's fully parallel save decides (``--ckpt-fully-parallel-save``, the
    default: FullyParallelSaveStrategyWrapper over the DP group; dist_checkpointing/exchange_utils.py,
    determine_main_replica_uniform_distribution + distribute_shards_to_ranks): shards held by fewer ranks first
    (a DP rank's own optimizer slices go to that rank), then the larger (bytes) first, then by shard id (key,
    global offset); each to the least loaded rank holding it (ties: the lower rank).  So with DP > 1 each
    replica writes some of the model's tensors, and the key order of .metadata (rank 0's plan first) is no
    longer the state dict's."""
    load = [0] * dp
    out = [None] * len(shards)

    def holders(shard):
        return range(dp) if shard[3] is None else (shard[3],)

    def nbytes(shard):
        return shard[2].numel() * shard[2].element_size()

    for i in sorted(range(len(shards)), key=lambda i: (len(holders(shards[i])), -nbytes(shards[i]), shards[i][0],
                                                        tuple(shards[i][1]))):
        _, rank = min((load[r], r) for r in holders(shards[i]))
        out[i] = rank
        load[rank] += nbytes(shards[i])
    return out


def bucket_padded_size(unpadded, dp):
    """A gradient bucket's size in the grad buffer: its end padded to a multiple of lcm(DP, 128) (core >= 0.7;
    megatron/core/optimizer/param_layout.py pad_bucket_end, without pad_buckets_for_high_nccl_busbw)."""
    m = math.lcm(dp, 128)
    return -(-unpadded // m) * m


def dp_slices(extents, unpadded, dp):
    """[(DP rank, start, end)]: the DCP chunks of one dp_reshardable bucket tensor (global shape (unpadded,)), as
    DistributedOptimizer.sharded_param_state_dp_reshardable (core 0.18.2) declares them on each DP rank: rank r owns
    [r*S, (r+1)*S) of the padded bucket (S = padded / DP, _build_model_gbuf_range) and saves, at global offset
    r*S + local start, the part of each parameter (``extents``: [(start, end)] in the bucket) inside it
    (gbuf_local) and each gap between those parts; the gaps before the first and after the last part only when
    they start before the bucket's unpadded end."""
    S = bucket_padded_size(unpadded, dp) // dp
    out = []
    for r in range(dp):
        parts = [(max(lo, r * S) - r * S, min(hi, (r + 1) * S) - r * S) for lo, hi in sorted(extents)
                 if min(hi, (r + 1) * S) > max(lo, r * S)]
        assert parts, f"DP rank {r} owns no parameter of a bucket ([{r * S}, {(r + 1) * S}) of {unpadded}): " \
                      f"Megatron asserts 'empty bucket encountered'"
        gaps = [(end, start) for end, start in zip([0] + [e for _, e in parts], [s for s, _ in parts] + [S])
                if start != end and r * S + end < unpadded]
        for lo, hi in sorted(parts + gaps):
            # Megatron declares a trailing gap up to the shard's end; past `unpadded` DCP refuses the save
            assert r * S + hi <= unpadded, f"DP rank {r}: chunk [{r * S + lo}, {r * S + hi}) past {unpadded}"
            out.append((r, r * S + lo, r * S + hi))
    return out


def declare_buckets(case, vals, keys, shards, domain_objects, gen):
    """The distributed optimizer's dp_reshardable state (core >= 0.15), as each rank's DistributedOptimizer
    saves it: per model-parallel domain i = pp * TP + tp, model chunk (gbuf_idx) and gradient bucket, the 1-D
    tensors ``optimizer.distributed.dp_group_idx_{i}.gbuf_idx_{v}.dtype_{(param, grad)}.bucket_idx_{b}.{param,
    exp_avg,exp_avg_sq}`` of the bucket's unpadded size, the compact buffer layout (pack_buffer, 64-element
    aligned), each DP rank writing its own slice of every bucket, one chunk per parameter part and per gap
    (``dp_slices``); and the ShardedObjects ``per_bucket_numel``, ``per_bucket_numel_unpadded`` and ``optimizer`` of
    each domain (DP rank 0)."""
    tp, pp, dp = case["tp"], case["pp"], case["dp"]
    pair = (gen.DTYPE[case["dtype"]], torch.float32)
    dtype_key = f"({pair[0]}, {pair[1]})"  # Python's str() of the tuple, as Megatron formats it
    for p, t in [(p, t) for p in range(pp) for t in range(tp)]:
        prefix = f"optimizer.distributed.dp_group_idx_{p * tp + t}"
        numel, unpadded = [], []
        for v, chunk in enumerate(gen.rank_params(case, vals, t, p)):
            moments = [gen.adam_moments(vals.rng, m.shape) for _, m, _ in chunk]
            for kind, arrays in (("param", [m for _, m, _ in chunk]), ("exp_avg", [a for a, _ in moments]),
                                 ("exp_avg_sq", [b for _, b in moments])):
                flat, offsets, _, buckets = pack_buffer([(a, s) for a, (_, _, s) in zip(arrays, chunk)],
                                                        lambda n: gen.garbage(vals.rng, n).copy(), dp,
                                                        bucket_size=bucket_size(case, p, v))
                start = 0
                for b, size in enumerate(buckets):
                    key = f"{prefix}.gbuf_idx_{v}.dtype_{dtype_key}.bucket_idx_{b}.{kind}"
                    keys.append((key, (size,)))
                    extents = [(o - start, o - start + a.size) for o, a in zip(offsets, arrays) if start <= o < start + size]
                    for d, lo, hi in dp_slices(extents, size, dp):
                        shards[(p, t)].append((key, (lo,), torch.from_numpy(flat[start + lo:start + hi].copy()), d))
                    start += size
            numel.append({pair: [bucket_padded_size(u, dp) for u in buckets]})
            unpadded.append({pair: buckets})
        domain_objects[(p, t)] += [(f"{prefix}.per_bucket_numel/shard_0_1", [numel]),
                                   (f"{prefix}.per_bucket_numel_unpadded/shard_0_1", [unpadded]),
                                   (f"{prefix}.optimizer/shard_0_1",
                                    [{"param_groups": [gen.param_group(g == 0) for g in range(2)]}])]


def declare_flattened_masters(case, vals, tensors, keys, shards, gen):
    """The distributed optimizer's fully_sharded_model_space state (core 0.8-0.14 with fully parallel saving, the
    default there: DistributedOptimizer.sharded_param_state_fs_model_space): each DP rank saves, per parameter,
    the range of the parameter's flattened TP-local shard that falls into its slice of the parameter's bucket
    (param_range of _build_model_gbuf_param_range_map), under ``optimizer.state.{fp32_param,exp_avg,exp_avg_sq}
    .<model key>``; such N-D flattened ShardedTensors are stored reformulated (core 0.9's
    sharded_tensor_to_torch_sharded_tensor, resharding.nd_flattened_tensor_reformulated_global_shape): global
    shape [fragments per dimension..., numel of a local shard], the chunk (fragment index..., range start), 1-D
    tensors as they are at global offset + range start.  SwiGLU fc1's [gate_r; up_r] range is cut at the half
    (apply_swiglu_sharded_factory): gate part to fragment r, up part to fragment TP + r."""
    tp, pp, dp = case["tp"], case["pp"], case["dp"]
    assert not case["tied"], "fully_sharded_model_space cases: untied (the tied copy's state is not saved)"
    where = {src: (key, g, rule_of(case, src)) for key, g, src, _ in tensors}
    for p, t in [(p, t) for p in range(pp) for t in range(tp)]:
        for v, chunk in enumerate(gen.rank_params(case, vals, t, p)):
            moments = [gen.adam_moments(vals.rng, m.shape) for _, m, _ in chunk]
            _, offsets, _, buckets = pack_buffer([(m, s) for _, m, s in chunk], lambda n: gen.garbage(vals.rng, n), dp,
                                                 bucket_size=bucket_size(case, p, v))
            starts = list(itertools.accumulate([0] + buckets[:-1]))
            for (e, master, _), (ea, eas), off in zip(chunk, moments, offsets):
                b = max(i for i, st in enumerate(starts) if st <= off)
                S = bucket_padded_size(buckets[b], dp) // dp
                lo_in_bucket = off - starts[b]
                key, g, rule = where[e.src]
                full = vals.master[e.src]
                for kind, a in (("fp32_param", master), ("exp_avg", ea), ("exp_avg_sq", eas)):
                    for d in range(dp):
                        lo = max(lo_in_bucket, d * S) - lo_in_bucket
                        hi = min(lo_in_bucket + master.size, (d + 1) * S) - lo_in_bucket
                        for piece_key, offset, piece in _flattened_pieces(f"optimizer.state.{kind}.{key}", g, rule,
                                                                          full.shape, a, t, tp, lo, hi, case):
                            shards[(p, t)].append((piece_key, offset, piece, d))
                    keys.append(_flattened_key(f"optimizer.state.{kind}.{key}", g, rule, full.shape, tp, case))


def _local_pieces(rule, local, t, tp, full_shape):
    """[(global offsets of the piece in the full TP=1 tensor, the piece's local shape, first flat index of the
    piece in the rank's local tensor)]: one piece, or SwiGLU's gate and up halves."""
    if rule == "glu":
        half = local.shape[0] // 2
        shape = (half,) + local.shape[1:]
        return [((t * half,) + (0,) * (local.ndim - 1), shape, 0),
                ((full_shape[0] // 2 + t * half,) + (0,) * (local.ndim - 1), shape, half * math.prod(local.shape[1:]))]
    if rule == "rep":
        return [((0,) * local.ndim, local.shape, 0)]
    if rule == "row":
        return [((0, t * local.shape[1]) + (0,) * (local.ndim - 2), local.shape, 0)]
    return [((t * local.shape[0],) + (0,) * (local.ndim - 1), local.shape, 0)]


def _flattened_key(key, g, rule, full_shape, tp, case):
    """(key, reformulated global shape) of a flattened master."""
    local = _fragment_shape(rule, full_shape, tp)
    fragments = tuple(f // l for f, l in zip(full_shape, local))
    if g is None and len(full_shape) == 1:
        return key, tuple(full_shape)
    return key, ((case["layers"],) if g is not None else ()) + fragments + (math.prod(local),)


def _fragment_shape(rule, full_shape, tp):
    """The local shape of one fragment of a full tensor split by ``rule`` over TP ranks."""
    if rule == "rep" or tp == 1 and rule != "glu":
        return tuple(full_shape)
    if rule == "row":
        return (full_shape[0], full_shape[1] // tp) + tuple(full_shape[2:])
    if rule == "glu":
        return (full_shape[0] // (2 * tp),) + tuple(full_shape[1:])
    return (full_shape[0] // tp,) + tuple(full_shape[1:])


def _flattened_pieces(key, g, rule, full_shape, local_values, t, tp, lo, hi, case):
    """[(key, chunk offsets, chunk)] of range [lo, hi) of a rank's flattened local tensor ``local_values``."""
    if lo >= hi or (rule == "rep" and t > 0):
        return []
    flat = torch.from_numpy(local_values.reshape(-1).copy())
    local = _fragment_shape(rule, full_shape, tp)
    out = []
    for offsets, shape, first in _local_pieces(rule, local_values, t, tp, full_shape):
        n = math.prod(shape)
        a, b = max(lo, first) - first, min(hi, first + n) - first
        if a >= b:
            continue
        fragment = tuple(o // s for o, s in zip(offsets, local))
        data = flat[first + a:first + b].clone()
        if g is None and len(full_shape) == 1:
            out.append((key, (offsets[0] + a,), data))
        else:
            idx = ((g,) if g is not None else ()) + fragment
            out.append((key, idx + (a,), data.view((1,) * len(idx) + (b - a,))))
    return out


def declare_param_state(case, vals, domain_objects, gen):
    """The distributed optimizer's dp_zero_gather_scatter state (core 0.7-0.14 without fully parallel saving):
    per model-parallel domain i = pp * TP + tp the ShardedObject ``optimizer.distributed.dp_group_idx_{i}
    .param_state``, the same coalesced dict as that rank's distrib_optim.pt (gathered on DP rank 0, which writes
    it), and ``...optimizer``."""
    tp, pp = case["tp"], case["pp"]
    for p, t in [(p, t) for p in range(pp) for t in range(tp)]:
        prefix = f"optimizer.distributed.dp_group_idx_{p * tp + t}"
        state = gen.distrib_optim_state(case, gen.rank_params(case, vals, t, p), vals.rng, p)
        domain_objects[(p, t)] += [(f"{prefix}.param_state/shard_0_1", [state]),
                                   (f"{prefix}.optimizer/shard_0_1",
                                    [{"param_groups": [gen.param_group(g == 0) for g in range(2)]}])]


def common_state(case, iteration, with_optim, gen):
    it = 0 if iteration == "release" else iteration
    args = make_args(case, iteration)
    args.ckpt_format, args.use_dist_ckpt, args.ckpt_fully_parallel_save = "torch_dist", True, True
    state = {"args": args, "checkpoint_version": 3.0, "iteration": it}
    if with_optim:
        state["optimizer"] = {"optimizer": {"state": {"common_step": torch.tensor(float(it))},
                                            "param_groups": [gen.param_group(g == 0) for g in range(2)]}}
    if case["optimizer"]:
        state["opt_param_scheduler"] = gen.scheduler_state(it)
    state["num_floating_point_operations_so_far"] = 0
    state["content_metadata"] = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if with_optim and case["dist_opt"]:
        state["content_metadata"]["distrib_optim_sharding_type"] = case["dist_optim_sharding"]
    return state


# ----------------------------------------------------------------------------------------------------
# host side of the chroot writer

def chroot_status():
    """(chroot dir, None) when ready, else (chroot dir, why not)."""
    chroot = RG.default_chroot()
    if RG.chroot_ready(chroot):
        return chroot, None
    return chroot, (f"the Debian 13 chroot (torch 2.6) is not set up ({chroot}/.ckptfs-chroot-complete missing): run "
                    f"`bash mount_tests/modern/setup_chroot.sh` or point CKPTFS_CHROOT at it")


def write_dcp(case_dirs, chroot, timeout=TIMEOUT):
    """Runs chroot_megatron_dist.py over the plans of every case dir (one gloo world per world size) and
    moves the DCP files into each iteration dir; leaves ``.plans/<tag>/full.pt`` (the DCP read back by
    PyTorch) for ``finish``."""
    tag = f"ckptfs-gen-megatron-{os.getpid()}"
    host = os.path.join(chroot, "tmp", tag)
    shutil.rmtree(host, ignore_errors=True)
    os.makedirs(os.path.join(host, "tmp"))
    try:
        shutil.copy(CHROOT_SCRIPT, host)
        groups = collections.defaultdict(list)  # world size -> [job dir inside the chroot]
        for n, d in enumerate(case_dirs):
            with open(os.path.join(d, "case.json.pending")) as f:
                info = json.load(f)
            for it_tag in info["tags"]:
                job = os.path.join("jobs", f"{n}-{it_tag}")
                shutil.copytree(os.path.join(d, PLANS, it_tag), os.path.join(host, job))
                groups[info["tp"] * info["dp"] * info["pp"]].append(f"/tmp/{tag}/{job}")
        cmd = RG.in_chroot_cmd(chroot, "python3", f"/tmp/{tag}/chroot_megatron_dist.py",
                               json.dumps(sorted(groups.items())), tmpdir=f"/tmp/{tag}/tmp")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"torch_dist writer timed out after {timeout}s: {' '.join(cmd)}\n{e.stdout}\n{e.stderr}")
        if proc.returncode != 0:
            log = "\n".join(l for l in (proc.stdout + proc.stderr).splitlines() if "UCX" not in l and "cpuinfo" not in l)
            raise RuntimeError(f"torch_dist writer failed (exit {proc.returncode}): {' '.join(cmd)}\n{log[-6000:]}")
        for n, d in enumerate(case_dirs):
            with open(os.path.join(d, "case.json.pending")) as f:
                info = json.load(f)
            for it_tag in info["tags"]:
                job = os.path.join(host, "jobs", f"{n}-{it_tag}")
                for f in os.listdir(os.path.join(job, "dcp")):
                    shutil.move(os.path.join(job, "dcp", f), os.path.join(d, "checkpoint", it_tag, f))
                shutil.move(os.path.join(job, "full.pt"), os.path.join(d, PLANS, it_tag, "full.pt"))
    finally:
        shutil.rmtree(host, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------
# the self-check: the DCP as PyTorch reads it back (full.pt: every key assembled from its chunks by
# torch.distributed.checkpoint), unstacked and renamed by the spec's rules, against the expectations

def _unstack(args, full):
    """{merged name: tensor} from {torch_dist key: global tensor}: stacked layers split on axis 0, TE norm
    names back to the local spec's when ``transformer_impl == 'local'``."""
    out = {}
    local = args.transformer_impl == "local"
    for k, t in full.items():
        if not k.startswith("decoder.layers."):
            out[k] = t
            continue
        rest = k[len("decoder.layers."):]
        if local:
            for name, te in TE_NAMES:
                if rest.startswith(te):
                    rest = name + rest[len(te):]
        assert t.shape[0] == args.num_layers, k
        for g in range(args.num_layers):
            out[f"decoder.layers.{g}.{rest}"] = t[g]
    return out


def reference_merge(iter_dir, dump):
    """(args, model, fp32) of a torch_dist iteration dir, from its common.pt (or, without one, its common_state
    bytes item) and ``dump`` (full.pt)."""
    with open(os.path.join(iter_dir, "metadata.json")) as f:
        backend = json.load(f)
    if os.path.exists(os.path.join(iter_dir, "common.pt")):
        assert backend == METADATA_JSON and COMMON_STATE not in dump["bytes"]
        common = torch.load(os.path.join(iter_dir, "common.pt"), map_location="cpu")
    else:  # core 0.19+
        assert backend == METADATA_JSON_019, backend
        (common,) = torch.load(io.BytesIO(dump["bytes"][COMMON_STATE]), map_location="cpu")
        assert isinstance(common, dict) and "args" in common, type(common)
    args = common["args"]
    assert args.ckpt_format == "torch_dist" and common["checkpoint_version"] == 3.0
    tp = args.tensor_model_parallel_size
    files = sorted(f for f in os.listdir(iter_dir) if f.endswith(".distcp"))
    world = tp * args.data_parallel_size * args.pipeline_model_parallel_size
    assert files == [f"__{r}_0.distcp" for r in range(world)], files
    for key, chunks in dump["chunks"].items():
        # replicated tensors (1-D per layer, or norms) come from TP rank 0 only: rank % TP == 0
        if key.endswith(("layernorm.weight", "layer_norm_weight", "layer_norm_bias", "layernorm.bias")):
            assert all(int(f.split("_")[2]) % tp == 0 for _, _, f in chunks), (key, chunks)
    model = {k: v for k, v in dump["tensors"].items() if not k.startswith("optimizer.")}
    pre = "optimizer.state.fp32_param."
    fp32 = {k[len(pre):]: _unflatten(v, model[k[len(pre):]].shape) for k, v in dump["tensors"].items()
            if k.startswith(pre)}
    if any(k.startswith("optimizer.distributed.") for k in [*dump["tensors"], *dump["bytes"]]):
        # dp_reshardable / dp_zero_gather_scatter: the masters live in per-bucket tensors or per-domain objects
        # (finish checks them against the plans)
        assert args.use_distributed_optimizer and not fp32
        return args, _unstack(args, model), None
    if not (args.bf16 or args.fp16):
        assert not fp32
        fp32 = {k: v.float() for k, v in model.items()}
    for key in [k for k in dump["tensors"] if k.startswith("optimizer.state.exp_avg")]:
        assert key.split(".", 3)[3] in model, key
    for key, raw in dump["bytes"].items():
        if key.startswith("rng_state/"):  # numpy 2's arrays (numpy._core) inside: not loadable here
            assert zipfile.ZipFile(io.BytesIO(raw)).namelist(), key
            continue
        obj = torch.load(io.BytesIO(raw), map_location="cpu")
        assert isinstance(obj, list) and len(obj) == 1, (key, type(obj))
    return args, _unstack(args, model), _unstack(args, fp32)


def _unflatten(stored, shape):
    """A fully_sharded_model_space master as the model holds it: stored [fragments..., local numel] (one more
    dimension than the model tensor), each fragment's row its local shard flattened; other tensors as they are."""
    if stored.ndim != len(shape) + 1:
        return stored
    fragments = stored.shape[:-1]
    local = [n // f for n, f in zip(shape, fragments)]
    out = torch.empty(shape, dtype=stored.dtype)
    for idx in itertools.product(*map(range, fragments)):
        out[tuple(slice(i * l, (i + 1) * l) for i, l in zip(idx, local))] = stored[idx].reshape(local)
    return out


def check_optimizer_domains(plan_dir, dump):
    """The distributed optimizer's per-domain state as PyTorch reads it back equals what the plans wrote, bit
    for bit (the gaps hold garbage, NaN patterns included): every dp_reshardable bucket tensor the concatenation
    of its chunks (which tile it), every dp_zero_gather_scatter param_state object the plan's."""
    buckets = {k: v for k, v in dump["tensors"].items() if k.startswith("optimizer.distributed.")}
    states = {k: v for k, v in dump["bytes"].items() if k.startswith("optimizer.distributed.") and ".param_state/" in k}
    written, objects = {}, {}
    for name in sorted(f for f in os.listdir(plan_dir) if f.startswith("rank")):
        plan = torch.load(os.path.join(plan_dir, name))
        for key, chunks in plan["tensors"].items():
            if key.startswith("optimizer.distributed."):
                written.setdefault(key, []).extend(chunks)
        objects.update((k, v) for k, v in plan["objects"] if k in states)
    assert sorted(written) == sorted(buckets), (sorted(written)[:3], sorted(buckets)[:3])
    for key, chunks in written.items():
        chunks.sort(key=lambda c: c[0])
        assert [c[0][0] for c in chunks] == list(itertools.accumulate([0] + [c[1].numel() for c in chunks[:-1]]))
        assert torch.equal(torch.cat([c[1] for c in chunks]).view(torch.int32), buckets[key].view(torch.int32)), key
    assert sorted(objects) == sorted(states)
    for key, raw in states.items():
        _same_tree(key, torch.load(io.BytesIO(raw)), objects[key])


def _same_tree(what, a, b):
    """Nested dicts / lists / tensors equal, tensors bit for bit."""
    assert type(a) is type(b), (what, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), (what, list(a), list(b))
        for k in a:
            _same_tree(f"{what}[{k!r}]", a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for n, (x, y) in enumerate(zip(a, b)):
            _same_tree(f"{what}[{n}]", x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.contiguous().view(torch.uint8).equal(
            b.contiguous().view(torch.uint8)), what
    else:
        assert a == b, (what, a, b)


def finish(case_dir, check):
    """Checks every iteration of a torch_dist case dir against its expectations (``check(iter_dir, args,
    model, fp32, expected_dir)``) and removes the plans."""
    with open(os.path.join(case_dir, "case.json.pending")) as f:
        info = json.load(f)
    for tag in info["tags"]:
        dump = torch.load(os.path.join(case_dir, PLANS, tag, "full.pt"), map_location="cpu")
        iter_dir = os.path.join(case_dir, "checkpoint", tag)
        check_optimizer_domains(os.path.join(case_dir, PLANS, tag), dump)
        check(iter_dir, *reference_merge(iter_dir, dump), os.path.join(case_dir, info["expected"][tag]))
        if tag == info["latest"]:  # where the DCP put things, for the tests' fixture-layout checks
            info["dcp_tensor_order"] = [k for k in dump["order"] if k in dump["chunks"]]
            info["dcp_chunk_files"] = {k: sorted({f for _, _, f in c}) for k, c in dump["chunks"].items()}
    shutil.rmtree(os.path.join(case_dir, PLANS))
    info["dcp_files"] = sorted(os.listdir(os.path.join(case_dir, "checkpoint", info["latest"])))
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump(info, f, indent=1)
    os.remove(os.path.join(case_dir, "case.json.pending"))

