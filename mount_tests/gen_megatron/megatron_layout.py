"""Where every tensor of a Megatron-LM model goes: names (core local / TE spec, legacy nested), the
state-dict and parameter order, the pipeline layer split, the tensor-parallel split rules and the
distributed-optimizer buffer packing (Megatron-LM's rules; docs/formats/megatron.md says what ckptfs reads).

Values are numpy arrays (fp32 masters as float32, bf16/fp16 model weights as their int16 bit patterns:
the split is pure indexing).  Full tensors are keyed by short canonical names ('emb', 'L3.qkv.w', ...,
global layer numbers); ``Entry.src`` points at them.
"""
import math
import os
import sys

import numpy as np

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mount_tests/
from tp_slicing import tp_cols, tp_gated_rows, tp_rows  # noqa: E402

from megatron_cases import is_moe_layer  # noqa: E402


def padded_vocab(vocab, tp, divisor=128):
    m = divisor * tp
    return int(math.ceil(vocab / m) * m)


def dims(case):
    H, nh = case["hidden"], case["heads"]
    ng = case["groups"] or nh
    hn = H // nh
    d = dict(H=H, np=nh, ng=ng, hn=hn, qpg=nh // ng, F=case["ffn"], V=case["vocab"],
             Vp=padded_vocab(case["vocab"], case["tp"]), L=case["layers"])
    if case.get("experts"):
        d.update(E=case["experts"], EP=case["ep"], El=case["experts"] // case["ep"], Fe=case["moe_ffn"])
        assert d["El"] * case["ep"] == d["E"]
    return d


# ----------------------------------------------------------------------------------------------------
# pipeline

def chunk_layers(case):
    """{(pp_rank, vp_chunk): [global layer numbers]}; chunks take layers in VP-major order
    (v = 0: p = 0..PP-1, then v = 1, ...)."""
    L, PP, VP = case["layers"], case["pp"], case["vp"]
    if case["first_stage"]:
        assert VP == 1 and PP > 1 and (L - case["first_stage"]) % (PP - 1) == 0
        counts = [case["first_stage"]] + [(L - case["first_stage"]) // (PP - 1)] * (PP - 1)
        order = [(p, 0) for p in range(PP)]
    else:
        assert L % (PP * VP) == 0
        counts = [L // (PP * VP)] * (PP * VP)
        order = [(p, v) for v in range(VP) for p in range(PP)]
    out, start = {}, 0
    for (p, v), n in zip(order, counts):
        out[(p, v)] = list(range(start, start + n))
        start += n
    assert start == L
    return out


# ----------------------------------------------------------------------------------------------------
# names and order

class Entry:
    """One model state-dict entry.  ``path``: key path (one element for core flat dicts); ``src``: the
    canonical full tensor it is a TP shard of (None for ``_extra_state``); ``copy``: the tied output-layer
    copy on the last pipeline stage (not a name of the merged model); ``buffer``: a persistent buffer, not a
    parameter (no optimizer state)."""

    def __init__(self, path, src=None, extra=None, copy=False, buffer=False):
        self.path, self.src, self.extra, self.copy, self.buffer = tuple(path), src, extra, copy, buffer

    @property
    def name(self):
        return ".".join(self.path)

    @property
    def is_param(self):
        return self.src is not None


EXTRA_NONE = "none"        # Megatron's own linears: _extra_state None
EXTRA_TE = "te"            # TransformerEngine >= 2.0 modules: empty uint8 tensor


def expert_ids(case, ep_rank):
    """[(name index, global expert)] of EP rank ``ep_rank`` (None: every expert, global numbering: the merged
    TP=1 EP=1 model)."""
    if not case.get("experts"):
        return []
    if ep_rank is None:
        return [(e, e) for e in range(case["experts"])]
    n = case["experts"] // case["ep"]
    return [(e, ep_rank * n + e) for e in range(n)]


def _moe_mlp(case, g, add, experts):
    """MoE layer MLP entries: router, then SequentialMLP local_experts.{e} or TEGroupedMLP weight{e}, then the
    shared experts (SharedExpertMLP: its own gate_weight first, then its linears)."""
    te = case["spec"] == "te"
    _routed_experts(case, g, add, experts, te)
    if case.get("shared_ffn"):
        add(case["shared_gate"], "mlp.shared_experts.gate_weight", f"L{g}.shared.gate.w")
        for fc in ("linear_fc1", "linear_fc2"):
            add(True, f"mlp.shared_experts.{fc}.weight", f"L{g}.shared.{fc[-3:]}.w")
            add(True, f"mlp.shared_experts.{fc}._extra_state", extra=EXTRA_TE if te else EXTRA_NONE)


def _routed_experts(case, g, add, experts, te):
    """The pre-MLP norm, the router (and its expert_bias buffer) and the routed experts."""
    add(True, "pre_mlp_layernorm.weight", f"L{g}.ln2.w")
    add(True, "mlp.router.weight", f"L{g}.router.w")
    add(case.get("expert_bias"), "mlp.router.expert_bias", f"L{g}.router.eb", buffer=True)  # TopKRouter's buffer
    if case["grouped_gemm"]:
        for fc in ("linear_fc1", "linear_fc2"):
            for e, x in experts:
                add(True, f"mlp.experts.{fc}.weight{e}", f"L{g}.x{x}.{fc[-3:]}.w")
            add(True, f"mlp.experts.{fc}._extra_state", extra=EXTRA_TE)
        return
    for e, x in experts:
        for fc in ("linear_fc1", "linear_fc2"):
            add(True, f"mlp.experts.local_experts.{e}.{fc}.weight", f"L{g}.x{x}.{fc[-3:]}.w")
            add(True, f"mlp.experts.local_experts.{e}.{fc}._extra_state", extra=EXTRA_TE if te else EXTRA_NONE)


def _layer_core(case, i, g, experts=()):
    te = case["spec"] == "te"
    b, qb, ln_b = case["bias"], case["bias"] or case["qkv_bias"], case["norm"] == "LayerNorm"
    p = f"decoder.layers.{i}."
    lx = EXTRA_TE if te else EXTRA_NONE
    E = []

    def add(cond, name, src=None, extra=None, buffer=False):
        if cond:
            E.append(Entry([p + name], src, extra, buffer=buffer))

    if te:
        add(True, "self_attention.core_attention._extra_state", extra=EXTRA_TE)
    else:
        add(True, "input_layernorm.weight", f"L{g}.ln1.w")
        add(ln_b, "input_layernorm.bias", f"L{g}.ln1.b")
    add(True, "self_attention.linear_proj.weight", f"L{g}.proj.w")
    add(b, "self_attention.linear_proj.bias", f"L{g}.proj.b")
    add(True, "self_attention.linear_proj._extra_state", extra=lx)
    add(te, "self_attention.linear_qkv.layer_norm_weight", f"L{g}.ln1.w")
    add(te and ln_b, "self_attention.linear_qkv.layer_norm_bias", f"L{g}.ln1.b")
    add(True, "self_attention.linear_qkv.weight", f"L{g}.qkv.w")
    add(qb, "self_attention.linear_qkv.bias", f"L{g}.qkv.b")
    add(True, "self_attention.linear_qkv._extra_state", extra=lx)
    add(case.get("qk_norm"), "self_attention.q_layernorm.weight", f"L{g}.qn.w")
    add(case.get("qk_norm"), "self_attention.k_layernorm.weight", f"L{g}.kn.w")
    if is_moe_layer(case, g):
        assert not ln_b and not b, "MoE cases: RMSNorm, no biases"
        _moe_mlp(case, g, add, experts)
        return E
    add(not te, "pre_mlp_layernorm.weight", f"L{g}.ln2.w")
    add(not te and ln_b, "pre_mlp_layernorm.bias", f"L{g}.ln2.b")
    add(te, "mlp.linear_fc1.layer_norm_weight", f"L{g}.ln2.w")
    add(te and ln_b, "mlp.linear_fc1.layer_norm_bias", f"L{g}.ln2.b")
    add(True, "mlp.linear_fc1.weight", f"L{g}.fc1.w")
    add(b, "mlp.linear_fc1.bias", f"L{g}.fc1.b")
    add(True, "mlp.linear_fc1._extra_state", extra=lx)
    add(True, "mlp.linear_fc2.weight", f"L{g}.fc2.w")
    add(b, "mlp.linear_fc2.bias", f"L{g}.fc2.b")
    add(True, "mlp.linear_fc2._extra_state", extra=lx)
    return E


def _layer_legacy(case, i, g):
    b, qb, ln_b = case["bias"], case["bias"] or case["qkv_bias"], case["norm"] == "LayerNorm"
    enc, p = ("language_model", "encoder"), f"layers.{i}."
    E = []
    for cond, name, src in (
            (True, "input_norm.weight", "ln1.w"), (ln_b, "input_norm.bias", "ln1.b"),
            (True, "self_attention.query_key_value.weight", "qkv.w"),
            (qb, "self_attention.query_key_value.bias", "qkv.b"),
            (True, "self_attention.query_key_value._extra_state", None),
            (True, "self_attention.dense.weight", "proj.w"), (b, "self_attention.dense.bias", "proj.b"),
            (True, "self_attention.dense._extra_state", None),
            (True, "post_attention_norm.weight", "ln2.w"), (ln_b, "post_attention_norm.bias", "ln2.b"),
            (True, "mlp.dense_h_to_4h.weight", "fc1.w"), (b, "mlp.dense_h_to_4h.bias", "fc1.b"),
            (True, "mlp.dense_h_to_4h._extra_state", None),
            (True, "mlp.dense_4h_to_h.weight", "fc2.w"), (b, "mlp.dense_4h_to_h.bias", "fc2.b"),
            (True, "mlp.dense_4h_to_h._extra_state", None)):
        if cond:
            E.append(Entry(enc + (p + name,), f"L{g}.{src}" if src else None, None if src else EXTRA_NONE))
    return E


def chunk_entries(case, layers, pre, post, local=True, ep_rank=0):
    """State-dict entries of one model chunk holding global ``layers``; ``pre``/``post``: first/last
    chunk of the pipeline.  ``local``: number layers from 0 and experts within EP rank ``ep_rank`` (rank
    files); else globally (merged names)."""
    legacy = case["naming"] == "legacy"
    ln_b = case["norm"] == "LayerNorm"
    learned = case["pos"] == "learned_absolute"
    # the last stage keeps a copy of the tied embedding when it is not also the first stage
    tied_copy = case["tied"] and post and not pre
    E = []
    if legacy:
        lm = ("language_model",)
        if pre:
            E.append(Entry(lm + ("embedding", "word_embeddings", "weight"), "emb"))
            if learned:
                E.append(Entry(lm + ("embedding", "position_embeddings", "weight"), "pos"))
        for i, g in enumerate(layers):
            E += _layer_legacy(case, i if local else g, g)
        if post:
            E.append(Entry(lm + ("encoder", "final_norm.weight"), "final.w"))
            if ln_b:
                E.append(Entry(lm + ("encoder", "final_norm.bias"), "final.b"))
            if not case["tied"]:
                E.append(Entry(lm + ("output_layer", "weight"), "out"))
                E.append(Entry(lm + ("output_layer", "_extra_state"), extra=EXTRA_NONE))
            if tied_copy:
                E.append(Entry(("word_embeddings_for_head", "weight"), "emb", copy=True))
        return E
    if pre:
        E.append(Entry(["embedding.word_embeddings.weight"], "emb"))
        if learned:
            E.append(Entry(["embedding.position_embeddings.weight"], "pos"))
    for i, g in enumerate(layers):
        E += _layer_core(case, i if local else g, g, expert_ids(case, ep_rank if local else None))
    if post:
        E.append(Entry(["decoder.final_layernorm.weight"], "final.w"))
        if ln_b:
            E.append(Entry(["decoder.final_layernorm.bias"], "final.b"))
        if not case["tied"]:
            E.append(Entry(["output_layer.weight"], "out"))
        elif tied_copy:
            E.append(Entry(["output_layer.weight"], "emb", copy=True))
        E.append(Entry(["output_layer._extra_state"], extra=EXTRA_NONE))
    return E


def merged_entries(case):
    """The entries of the model loaded into TP=1 PP=1 (the merged view's names and order)."""
    return chunk_entries(case, list(range(case["layers"])), True, True, local=False)


def rule_of(case, src):
    """TP split rule of a canonical tensor."""
    kind = src.split(".", 1)[1] if src.startswith("L") else src
    if is_expert(src) or kind.startswith("shared."):
        kind = kind.split(".", 1)[1]  # x{e}.fc1.w / shared.fc1.w -> fc1.w
    if src in ("emb", "out"):
        return "vocab"
    if kind in ("qkv.w", "qkv.b"):
        return "qkv"
    if kind in ("fc1.w", "fc1.b"):
        return "glu" if case["swiglu"] else "col"
    if kind in ("proj.w", "fc2.w"):
        return "row"
    return "rep"


def is_expert(src):
    """An expert's weight (canonical 'L{g}.x{e}.fc1.w'): expert-parallel, in the expert optimizer."""
    return src.startswith("L") and src.split(".")[1].startswith("x")


def tp_attrs(rule, expert=False):
    """The tensor-parallel attributes Megatron sets on a parameter (pickled on the fp32 masters)."""
    dim = {"vocab": 0, "qkv": 0, "glu": 0, "col": 0, "row": 1}.get(rule, -1)
    a = {"expert_tp": expert, "is_qkv": rule == "qkv", "tensor_model_parallel": dim >= 0,
         "partition_dim": dim, "partition_stride": 1}
    if expert:
        a["allreduce"] = False
    return a


# ----------------------------------------------------------------------------------------------------
# tensor-parallel split (the generator's side; megatron_check.py merges independently)

def split(case, rule, full, r):
    """TP rank r's shard of a full (TP=1 layout) tensor."""
    tp = case["tp"]
    if rule == "rep" or tp == 1:
        return full.copy()
    if rule in ("vocab", "col"):
        return tp_rows(full, r, tp).copy()
    if rule == "row":
        return tp_cols(full, r, tp).copy()
    if rule == "qkv":
        # full rows: ng groups of [q heads of the group, k, v]; rank r holds groups [r*ng/TP, (r+1)*ng/TP)
        d = dims(case)
        per = d["ng"] // tp
        assert per * tp == d["ng"]
        g = full.reshape((d["ng"], (d["qpg"] + 2) * d["hn"]) + full.shape[1:])
        return g[r * per:(r + 1) * per].reshape((-1,) + full.shape[1:]).copy()
    if rule == "glu":
        return np.concatenate(tp_gated_rows(full, r, tp))
    raise ValueError(rule)


# ----------------------------------------------------------------------------------------------------
# distributed optimizer: one grad buffer per model chunk, laid out by Megatron-LM's own rules (below), and
# the compact tensors distrib_optim.pt saves from it (bucket-end padding stripped)

ALIGN = 64


def bucket_size(case, pp_rank, vp_chunk):
    """Elements per gradient bucket of chunk (pp_rank, vp_chunk)'s buffer, None: one bucket.  Only with
    overlap_grad_reduce (--ddp-bucket-size, default max(40e6, 1e6 x DP)), and never on a PP rank > 0 or a
    VP chunk > 0 (Megatron forces a single bucket there: megatron/training/training.py get_model's
    per_chunk_bucket_sizes in core 0.18.2, DistributedDataParallel.__init__'s disable_bucketing / pp_rank > 0
    before)."""
    if not case["overlap_grad_reduce"] or pp_rank > 0 or vp_chunk > 0:
        return None
    return case["ddp_bucket_size"] or max(40_000_000, 1_000_000 * case["dp"])


def grad_buffer_layout(numels, shared, dp, bucket_size=None, aligned=True):
    """Megatron-LM's grad-buffer layout of one model chunk, step by step as Megatron computes it (not as
    ckptfs reads it).  ``numels``/``shared``: each param's element count and ``shared_embedding`` flag, in
    named_parameters order.  Returns (param ranges [(start, end, bucket)] in that order, bucket ranges
    [(start, padded end)], per_bucket_numel_unpadded), in grad-buffer elements.

    ``aligned`` (core >= 0.8), NVIDIA/Megatron-LM tag core_v0.18.2,
    megatron/core/optimizer/distrib_optimizer.py:483-564 DistributedOptimizer._compute_per_buffer_param_layout
    with megatron/core/optimizer/param_layout.py:24-44 pad_param_start / pad_bucket_end (core_v0.8.0:
    megatron/core/distributed/param_and_grad_buffer.py:244-349, _ParamAndGradBuffer.__init__): params in
    reverse order; each start padded to a multiple of 64; a shared embedding first closes the open bucket at
    its own (padded) start, then closes its own bucket; a bucket also closes once it holds >= bucket_size
    elements; a closed bucket's end is padded to lcm(DP, 128) (pad_buckets_for_high_nccl_busbw off) and the
    next param starts there.
    Not ``aligned`` (core 0.4-0.6), core_v0.6.0 megatron/core/distributed/param_and_grad_buffer.py:244-331
    (_pad_if_needed, _create_new_bucket): the same walk with unpadded starts and bucket ends padded to a
    multiple of DP."""
    def pad(n, m):
        return -(-n // m) * m

    end_divisor = math.lcm(dp, 128) if aligned else dp
    ranges, buckets, unpadded = [None] * len(numels), [], []
    bucket_start, start, open_params = 0, 0, 0

    def close(end):
        unpadded.append(end - bucket_start)
        buckets.append((bucket_start, pad(end, end_divisor)))
        return buckets[-1][1]

    for i in reversed(range(len(numels))):
        if aligned:
            start = pad(start, ALIGN)
        if shared[i] and open_params:
            bucket_start = start = close(start)
            open_params = 0
        end = start + numels[i]
        ranges[i] = (start, end, len(buckets))
        open_params += 1
        if shared[i] or (bucket_size is not None and end - bucket_start >= bucket_size):
            bucket_start = start = close(end)
            open_params = 0
        else:
            start = end
    if open_params:
        close(end)
    return ranges, buckets, unpadded


def pack_buffer(params, fill, dp, aligned=True, bucket_size=None):
    """params: [(array fp32, shared)] in named_parameters order.  Returns (values, offsets, total, buckets): the
    compact 1-D tensor distrib_optim.pt saves for the chunk, ``fill(total)`` (garbage where no param lies)
    holding each param's values at its offset, and per_bucket_numel_unpadded.  The compact tensor is the grad
    buffer (grad_buffer_layout) with each bucket's end padding cut out: bucket b starts at the sum of the
    unpadded sizes before it (core_v0.18.2 distrib_optimizer.py:1249-1347 get_parameter_state_dp_zero,
    ``offset_in_world_tensors += gbuf_world_numel_unpadded``)."""
    ranges, buckets, unpadded = grad_buffer_layout([a.size for a, _ in params], [s for _, s in params], dp,
                                                   bucket_size, aligned)
    bucket_offsets = [sum(unpadded[:b]) for b in range(len(buckets))]
    offsets = [bucket_offsets[b] + start - buckets[b][0] for start, _, b in ranges]
    total = sum(unpadded)
    out = fill(total)
    for (a, _), off in zip(params, offsets):
        out[off:off + a.size] = a.reshape(-1)
    return out, offsets, total, unpadded
