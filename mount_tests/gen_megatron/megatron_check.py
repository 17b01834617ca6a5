"""The generator's self-check: reads a written iteration dir back (torch.load of every rank file) and merges
it the way a reader must by Megatron-LM's rules (merge, distributed-optimizer buffers, param groups, QKV),
written apart from the splitting code in megatron_layout.py: rules come from the NAMES and the saved
``args``, layer offsets from counting the layers of each chunk in VP-major order, fp32 masters from the
saved param groups or from unpacking distrib_optim.pt.  ``check`` raises unless the result equals the
generator's expectations bit for bit.  Never used to judge ckptfs."""
import os
import re

import torch

LAYER = re.compile(r"^(decoder\.layers\.|language_model\.encoder\.layers\.)(\d+)\.(.*)$")
VOCAB = ("word_embeddings.weight", "output_layer.weight")
COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "query_key_value.weight", "query_key_value.bias")
GATED = ("linear_fc1.weight", "linear_fc1.bias", "dense_h_to_4h.weight", "dense_h_to_4h.bias")
ROW = ("linear_proj.weight", "linear_fc2.weight", "dense.weight", "dense_4h_to_h.weight")
TIED_COPIES = ("output_layer.weight", "word_embeddings_for_head.weight")
EXPERT = re.compile(r"^(.*\.mlp\.experts\.)(?:local_experts\.(\d+)(\..*)|(linear_fc[12]\.weight)(\d+))$")


def _flatten(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flatten(v, prefix + k + ".")
        else:
            yield prefix + k, v


def _params(chunk):
    """(name, tensor) of a chunk's parameters in state-dict order; _extra_state dropped."""
    return [(k, v) for k, v in _flatten(chunk) if not k.endswith("_extra_state")]


def _is_tied_copy(args, name, first_stage):
    """The last stage's copy of a tied embedding (the merged model keeps the first stage's)."""
    return not args.untie_embeddings_and_output_weights and name in TIED_COPIES and not first_stage


def _merge(args, name, shards):
    tp = len(shards)
    name = re.sub(r"(\.weight)\d+$", r"\1", name)  # TEGroupedMLP linear_fc1.weight{e}
    if name.endswith(VOCAB) or name.endswith(COLUMN) or (name.endswith(GATED) and not args.swiglu):
        return torch.cat(shards, 0)
    if name.endswith(GATED):
        halves = [s.chunk(2, 0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    if name.endswith(ROW):
        return torch.cat(shards, 1)
    for s in shards[1:]:
        assert _bytes(s) == _bytes(shards[0]), f"{name}: replicated tensor differs across {tp} TP ranks"
    return shards[0]


def _layout(chunk_params, tied_pp, first, last, align, bucket=None):
    """({name: offset}, total, buckets) of a compact buffer: params in reverse order, starts aligned to
    ``align``, shared embedding in its own bucket, and with ``bucket`` elements per gradient bucket a bucket
    closed after the param that fills it, the next one starting right there (bucket end padding not saved)."""
    offsets, base, cur, buckets = {}, 0, 0, 1
    for name, t in reversed(chunk_params):
        shared = tied_pp and ((first and name.endswith("word_embeddings.weight")) or
                              (last and name in TIED_COPIES))
        cur = (cur + align - 1) // align * align
        if shared and cur > 0:
            base, cur, buckets = base + cur, 0, buckets + 1
        offsets[name] = base + cur
        cur += t.numel()
        if shared or (bucket and cur >= bucket):
            base, cur, buckets = base + cur, 0, buckets + 1
    if cur == 0 and base > 0:  # the last param closed its bucket: no empty bucket after it
        buckets -= 1
    return offsets, base + cur, buckets


def _unpack_distrib(chunk_params, param, total, tied_pp, first, last, align, bucket=None):
    """The masters in a compact buffer ``param`` (``_layout``); the layout must end at ``total``.  With
    ``bucket``: the bucketed layout must differ from the single-bucket one (several buckets; aligned: other
    offsets, another total, so numel_unpadded tells them apart; unaligned (a tensor per bucket): the same
    offsets, the bucket count tells them apart), else the case would not exercise bucketing."""
    offsets, end, buckets = _layout(chunk_params, tied_pp, first, last, align, bucket)
    assert end == total, f"distrib_optim.pt size: layout {end}, file {total}"
    if bucket:
        single, single_end, _ = _layout(chunk_params, tied_pp, first, last, align)
        assert buckets > 1 and (align == 1 or (single != offsets and single_end != total)), \
            f"{bucket}-element buckets: {buckets} bucket(s), total {total} vs single bucket {single_end}"
    t = dict(chunk_params)
    return {n: param[off:off + t[n].numel()].view(t[n].shape) for n, off in offsets.items()}


def _unpack_2023(chunk_params, param, dp):
    """2023-05 (one grad buffer per chunk): forward parameter p at [total - sum of numels up to and including p,
    ...); the buffer padded at its end to a multiple of DP."""
    total = sum(t.numel() for _, t in chunk_params)
    assert param.numel() == -(-total // dp) * dp, f"2023 buffer: {param.numel()} elements, {total} padded to DP {dp}"
    out, end = {}, total
    for name, t in chunk_params:
        end -= t.numel()
        out[name] = param[end:end + t.numel()].view(t.shape)
    assert end == 0
    return out


def _distrib_masters(args, dist, per_chunk, p, PP, nkeys):
    """fp32 masters of each chunk from distrib_optim.pt, in whichever of the three layouts the file has."""
    dp, tied_pp = args.data_parallel_size, not args.untie_embeddings_and_output_weights and PP > 1
    # gradient buckets only with overlap_grad_reduce, and Megatron keeps one bucket on later PP stages / VP chunks
    bucket = (args.ddp_bucket_size or max(40_000_000, 1_000_000 * dp)) if args.overlap_grad_reduce else None
    param_dtype = torch.bfloat16 if args.bf16 else torch.float16
    out = []
    for v, c in enumerate(per_chunk):
        (key, world), = dist[v].items()
        assert set(world) >= {"param", "exp_avg", "exp_avg_sq"}, sorted(world)
        ends = dict(tied_pp=tied_pp, first=p == 0 and v == 0, last=p == PP - 1 and v == nkeys - 1)
        if "buckets_coalesced" in dist:  # core >= 0.7
            assert dist["buckets_coalesced"] is True and key == (param_dtype, torch.float32), key
            assert world["param"].numel() == world["numel_unpadded"]
            out.append(_unpack_distrib(c, world["param"], world["numel_unpadded"], align=64,
                                       bucket=bucket if p == 0 and v == 0 else None, **ends))
        elif "per_bucket_numel" in dist:  # core 0.4-0.6: a tensor per bucket, each padded to a multiple of DP
            assert key in ((param_dtype, torch.float32), torch.float32), key
            sizes, unpadded = dist["per_bucket_numel"][v][key], dist["per_bucket_numel_unpadded"][v][key]
            buckets = world["param"]
            assert isinstance(buckets, list) and len(buckets) == len(sizes) == len(unpadded)
            for b, n, u in zip(buckets, sizes, unpadded):
                assert b.dim() == 1 and b.numel() == n == -(-u // dp) * dp, (b.numel(), n, u, dp)
            bucketing = dict(align=1, bucket=bucket if p == 0 and v == 0 else None, **ends)
            assert _layout(c, **bucketing)[2] == len(buckets), f"{len(buckets)} bucket tensors"
            compact = torch.cat([b[:u] for b, u in zip(buckets, unpadded)])
            out.append(_unpack_distrib(c, compact, sum(unpadded), **bucketing))
        else:  # 2023-05
            assert key == torch.float32 and isinstance(v, int), key
            out.append(_unpack_2023(c, world["param"], dp))
    assert sorted(k for k in dist if isinstance(k, int)) == list(range(len(per_chunk)))
    return out


def _rank_dir(t, p, e, PP, EP):
    return "mp_rank_%02d" % t + ("_%03d" % p if PP > 1 else "") + ("_%03d" % e if EP > 1 else "")


def _global_expert(name, e, n_local):
    """Name with EP rank e's local expert index made global (None: not an expert parameter)."""
    m = EXPERT.match(name)
    if not m:
        return None
    if m.group(2) is not None:
        return f"{m.group(1)}local_experts.{e * n_local + int(m.group(2))}{m.group(3)}"
    return f"{m.group(1)}{m.group(4)}{e * n_local + int(m.group(5))}"


def _chained_distrib_masters(args, dist, opt, per_chunk, p, PP, nkeys, e):
    """MoE with the distributed optimizer: distrib_optim.pt is the ChainedOptimizer's list [dense, expert], each
    entry a dict of buffers (one per chunk) over ITS params only (the mlp.experts.* names, or all the others),
    or None where the saving rank is not that optimizer's DP rank 0: the dense entry of every EP rank > 0 dir
    (its dense masters are EP rank 0's; they are left out here, the merge takes EP rank 0's)."""
    assert isinstance(dist, list) and len(dist) == 2, f"ChainedOptimizer: {type(dist).__name__} of {len(dist)}"
    assert isinstance(opt, list) and len(opt) == 2
    masters = [{} for _ in per_chunk]
    for state, o, expert in zip(dist, opt, (False, True)):
        mine = [[(n, x) for n, x in c if bool(EXPERT.match(n)) == expert] for c in per_chunk]
        assert all(mine), f"{'expert' if expert else 'dense'} optimizer: a model chunk without params"
        # DistributedOptimizer.state_dict: param groups without 'params', one per non-empty kind (2-D, 1-D)
        kinds = {x.dim() >= 2 for c in mine for _, x in c}
        groups = o["optimizer"]["param_groups"]
        assert "params" not in groups[0] and len(groups) == len(kinds), (expert, len(groups), kinds)
        assert [pg["is_expert_parallel"] for pg in groups] == [expert] * len(groups)
        if state is None:
            assert not expert and e > 0, f"EP rank {e}: no {'expert' if expert else 'dense'} optimizer state"
            continue
        assert expert or e == 0, f"EP rank {e} saved the dense state (only dense DP rank 0 does)"
        for m, got in zip(masters, _distrib_masters(args, state, mine, p, PP, nkeys)):
            assert not set(m) & set(got)
            m.update(got)
    return masters


def _masters(args, sd, d, per_chunk, p, PP, nkeys, e=0):
    """fp32 masters of one rank file's chunks (EP rank ``e``): [{name: tensor}] per chunk."""
    if "optimizer" not in sd or not (args.bf16 or args.fp16):
        return [{n: x.float() for n, x in c} for c in per_chunk]
    masters = [dict(c) for c in per_chunk]
    opt = sd["optimizer"]
    if args.use_distributed_optimizer:
        dist = torch.load(os.path.join(d, "distrib_optim.pt"), map_location="cpu")
        if getattr(args, "num_experts", None):
            return _chained_distrib_masters(args, dist, opt, per_chunk, p, PP, nkeys, e)
        assert isinstance(dist, dict) and isinstance(opt, dict)
        return _distrib_masters(args, dist, per_chunk, p, PP, nkeys)
    # ChainedOptimizer (MoE): [dense optimizer, expert optimizer], each over its own params
    parts = list(zip(opt, (False, True))) if isinstance(opt, list) else [(opt, None)]
    assert len(parts) == (2 if getattr(args, "num_experts", None) else 1)
    for o, expert in parts:
        # buffers (the router's float32 expert_bias) have no master: their own value stands for it
        flat = [(v, n, x) for v, c in enumerate(per_chunk) for n, x in c
                if (expert is None or bool(EXPERT.match(n)) == expert) and not n.endswith("router.expert_bias")]
        # one group per kind that has params: 2-D weights (decay), then 1-D (no decay)
        groups = [g for g in ([f for f in flat if f[2].dim() >= 2], [f for f in flat if f[2].dim() == 1]) if g]
        saved = o["fp32_from_fp16_params"]
        assert [len(g) for g in saved] == [len(g) for g in groups], (d, expert)
        assert [pg["is_expert_parallel"] for pg in o["optimizer"]["param_groups"]] == [bool(expert)] * len(groups)
        for g, grp in enumerate(groups):
            for (v, n, x), m in zip(grp, saved[g]):
                assert m.dtype == torch.float32 and m.shape == x.shape, n
                masters[v][n] = m
    return masters


def reference_merge(iter_dir):
    names = sorted(n for n in os.listdir(iter_dir) if n.startswith("mp_rank_"))
    first = torch.load(os.path.join(iter_dir, names[0], "model_optim_rng.pt"), map_location="cpu")
    args = first["args"]
    TP, PP = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    EP, E = args.expert_model_parallel_size, getattr(args, "num_experts", None) or 0
    want = [_rank_dir(t, p, e, PP, EP) for p in range(PP) for t in range(TP) for e in range(EP)]
    assert sorted(want) == names, f"rank dirs {names}, args say {want}"
    # per (pp, vp) chunk: per tp rank: [(name, model tensor)], [(name, fp32)]; experts renamed to global
    chunks = {}
    for p in range(PP):
        for t in range(TP):
            merged = None
            for e in range(EP):
                d = os.path.join(iter_dir, _rank_dir(t, p, e, PP, EP))
                sd = torch.load(os.path.join(d, "model_optim_rng.pt"), map_location="cpu")
                assert sd["args"].tensor_model_parallel_size == TP and sd["checkpoint_version"] == 3.0
                keys = ["model"] if "model" in sd else sorted((k for k in sd if re.fullmatch(r"model\d+", k)),
                                                               key=lambda k: int(k[5:]))
                per_chunk = [_params(sd[k]) for k in keys]
                masters = _masters(args, sd, d, per_chunk, p, PP, len(keys), e)
                ren = [[(_global_expert(n, e, E // EP if E else 0) or n, n, x) for n, x in c] for c in per_chunk]
                if merged is None:
                    merged = [([(g, x) for g, _, x in c], {g: ms[n] for g, n, _ in c}) for c, ms in zip(ren, masters)]
                    continue
                for (mc, mm), c, ms in zip(merged, ren, masters):
                    base = dict(mc)
                    for g, n, x in c:
                        if g == n:  # dense: the same in every EP rank (ckptfs takes EP rank 0's)
                            assert _bytes(base[g]) == _bytes(x), f"{d}: {n} differs from EP rank 0's"
                        else:
                            mc.append((g, x))
                            mm[g] = ms[n]
            for v, cm in enumerate(merged):
                chunks.setdefault((p, v), []).append(cm)
    VP = max(v for _, v in chunks) + 1
    model, fp32, offset = {}, {}, 0
    for v in range(VP):
        for p in range(PP):
            ranks = chunks[(p, v)]
            local = sorted({int(m.group(2)) for n, _ in ranks[0][0] for m in [LAYER.match(n)] if m})
            assert local == list(range(len(local))), f"chunk ({p}, {v}): layers {local}"
            for n, _ in ranks[0][0]:
                if _is_tied_copy(args, n, p == 0 and v == 0):
                    continue
                m = LAYER.match(n)
                g = f"{m.group(1)}{int(m.group(2)) + offset}.{m.group(3)}" if m else n
                model[g] = _merge(args, n, [dict(c)[n] for c, _ in ranks])
                fp32[g] = _merge(args, n, [ms[n] for _, ms in ranks])
            offset += len(local)
    assert offset == args.num_layers
    return args, model, fp32


def hf_from_merged(args, model):
    """§6.1 / §3.5.2 on the merged tensors (core or legacy names): Llama/Qwen2 (SwiGLU) or GPT-2 names."""
    return (_hf_llama if args.swiglu else _hf_gpt2)(args, model)


# GPT-2 (HF convert_megatron_gpt2_checkpoint.py): Megatron module (core local, TE, legacy) -> HF module
GPT2_TOP = {"embedding.word_embeddings": "transformer.wte", "embedding.position_embeddings": "transformer.wpe",
            "decoder.final_layernorm": "transformer.ln_f", "encoder.final_norm": "transformer.ln_f",
            "output_layer": "lm_head"}
GPT2_LAYER = {"input_layernorm": "ln_1", "input_norm": "ln_1", "self_attention.linear_qkv.layer_norm": "ln_1",
              "pre_mlp_layernorm": "ln_2", "post_attention_norm": "ln_2", "mlp.linear_fc1.layer_norm": "ln_2",
              "self_attention.linear_qkv": "attn.c_attn", "self_attention.query_key_value": "attn.c_attn",
              "self_attention.linear_proj": "attn.c_proj", "self_attention.dense": "attn.c_proj",
              "mlp.linear_fc1": "mlp.c_fc", "mlp.dense_h_to_4h": "mlp.c_fc",
              "mlp.linear_fc2": "mlp.c_proj", "mlp.dense_4h_to_h": "mlp.c_proj"}


def _hf_gpt2(args, model):
    """Conv1D weights transposed ([in, out]); the per-head [q_h; k_h; v_h] QKV rows regrouped to
    [all q; all k; all v]; vocab cut to args.vocab_size."""
    nq, hn = args.num_attention_heads, args.kv_channels
    hf = {}
    for n, t in model.items():
        module, kind = n.rsplit(".", 1)
        if kind.startswith("layer_norm_"):  # TE: linear_qkv.layer_norm_weight
            module, kind = module + ".layer_norm", kind[len("layer_norm_"):]
        m = LAYER.match(module + ".")
        if m:
            out = f"transformer.h.{m.group(2)}.{GPT2_LAYER[m.group(3)[:-1]]}"
        else:
            out = GPT2_TOP[module.replace("language_model.", "", 1)]
        if out.endswith("c_attn"):
            t = t.reshape((nq, 3, hn) + tuple(t.shape[1:])).transpose(0, 1).reshape(t.shape)
        if out in ("transformer.wte", "lm_head"):
            t = t[:args.vocab_size]
        hf[f"{out}.{kind}"] = t.t().contiguous() if t.dim() == 2 and ".h." in out and "ln_" not in out else t
    return hf


def _hf_llama(args, model):
    nq, hn = args.num_attention_heads, args.kv_channels
    ng = args.num_query_groups if args.group_query_attention else nq
    qpg = nq // ng
    V = args.vocab_size
    hf = {}
    for n, t in model.items():
        m = LAYER.match(n)
        if not m:
            key = {"embedding.word_embeddings.weight": "model.embed_tokens.weight",
                   "language_model.embedding.word_embeddings.weight": "model.embed_tokens.weight",
                   "decoder.final_layernorm.weight": "model.norm.weight",
                   "language_model.encoder.final_norm.weight": "model.norm.weight",
                   "output_layer.weight": "lm_head.weight",
                   "language_model.output_layer.weight": "lm_head.weight"}[n]
            hf[key] = t[:V] if key in ("model.embed_tokens.weight", "lm_head.weight") else t
            continue
        p, rest = f"model.layers.{m.group(2)}.", m.group(3)
        if rest.endswith(("linear_qkv.weight", "linear_qkv.bias", "query_key_value.weight", "query_key_value.bias")):
            kind = rest.rsplit(".", 1)[1]
            w = t.reshape((ng, qpg + 2, hn) + tuple(t.shape[1:]))
            hf[p + f"self_attn.q_proj.{kind}"] = w[:, :qpg].reshape((nq * hn,) + tuple(t.shape[1:]))
            hf[p + f"self_attn.k_proj.{kind}"] = w[:, qpg].reshape((ng * hn,) + tuple(t.shape[1:]))
            hf[p + f"self_attn.v_proj.{kind}"] = w[:, qpg + 1].reshape((ng * hn,) + tuple(t.shape[1:]))
        elif EXPERT.match(n):
            hf.update(_hf_expert(args, p, n, t))
        elif rest == "mlp.router.weight":
            hf[p + ("mlp.gate.weight" if _qwen_moe(args) else "block_sparse_moe.gate.weight")] = t
        elif rest == "mlp.shared_experts.gate_weight":
            hf[p + "mlp.shared_expert_gate.weight"] = t
        elif rest == "mlp.shared_experts.linear_fc1.weight":
            hf[p + "mlp.shared_expert.gate_proj.weight"], hf[p + "mlp.shared_expert.up_proj.weight"] = t.chunk(2, 0)
        elif rest == "mlp.shared_experts.linear_fc2.weight":
            hf[p + "mlp.shared_expert.down_proj.weight"] = t
        elif rest.endswith(("linear_fc1.weight", "dense_h_to_4h.weight")):
            gate, up = t.chunk(2, 0)
            hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = gate, up
        else:
            key = {"input_layernorm.weight": "input_layernorm.weight",
                   "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                   "input_norm.weight": "input_layernorm.weight",
                   "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
                   "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
                   "post_attention_norm.weight": "post_attention_layernorm.weight",
                   "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
                   "self_attention.dense.weight": "self_attn.o_proj.weight",
                   "mlp.linear_fc2.weight": "mlp.down_proj.weight",
                   "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
                   "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
                   "mlp.dense_4h_to_h.weight": "mlp.down_proj.weight"}[rest]
            hf[p + key] = t
    return hf


def _qwen_moe(args):
    """Qwen3-MoE (q/k layernorm) or Qwen2-MoE (shared experts) names, else Mixtral's."""
    return args.qk_layernorm or bool(getattr(args, "moe_shared_expert_intermediate_size", None))


def _hf_expert(args, p, name, t):
    """Expert e's fc1 (= [gate; up]) or fc2 under Qwen2/3-MoE's names or Mixtral's (w1 gate, w3 up, w2
    down)."""
    m = EXPERT.match(name)
    e, fc = (m.group(2), m.group(3)[1:]) if m.group(2) is not None else (m.group(5), m.group(4))
    if _qwen_moe(args):
        gate, up, down = (f"mlp.experts.{e}.{x}_proj.weight" for x in ("gate", "up", "down"))
    else:
        gate, up, down = (f"block_sparse_moe.experts.{e}.{x}.weight" for x in ("w1", "w3", "w2"))
    if fc.startswith("linear_fc2"):
        return {p + down: t}
    g, u = t.chunk(2, 0)
    return {p + gate: g, p + up: u}


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _same(what, ours, exp):
    assert set(ours) == set(exp), f"{what}: names differ: only ours {sorted(set(ours) - set(exp))[:5]}, " \
                                  f"only expected {sorted(set(exp) - set(ours))[:5]}"
    for k, e in exp.items():
        o = ours[k].contiguous()
        assert o.dtype == e.dtype and o.shape == e.shape, \
            f"{what}: {k}: {o.dtype} {tuple(o.shape)}, expected {e.dtype} {tuple(e.shape)}"
        assert _bytes(o) == _bytes(e), f"{what}: {k}: bytes differ"


def check(iter_dir, model, fp32, hf=None):
    compare(iter_dir, *reference_merge(iter_dir), model, fp32, hf)


def compare(iter_dir, args, m, f, model, fp32, hf=None):
    """Raises unless the merged (m, f) are the expectations (and give ``hf``)."""
    _same(f"{iter_dir}: model", m, model)
    if f is not None:  # None: masters in dp_reshardable buckets, checked where they are written
        _same(f"{iter_dir}: fp32", f, fp32)
    if hf is not None:
        _same(f"{iter_dir}: hf", hf_from_merged(args, m), hf)
