"""A float64 numpy forward pass of the UNSPLIT Megatron-LM GPT model, written from Megatron's own definitions
(megatron/core/models/gpt, transformer/attention.py, mlp.py, fusions/fused_bias_gelu.py,
models/common/embeddings/rotary_pos_embedding.py, transformer/moe/router.py and moe_utils.py; legacy/model/
transformer.py for openai_gelu), NOT from
Hugging Face's code: the reference the chroot test compares transformers' logits of the mounted hf/ with.

Input: the merged Megatron tensors in the generator's canonical names (TP=1 layout: fused QKV in query
groups of [q heads; k; v], fc1 = [all gates; all ups] with SwiGLU, padded vocab) holding the values as
STORED in the training dtype (bf16/fp16 bit patterns upcast exactly), and the saved ``args``.  Output:
logits [batch, seq, true vocab].
"""
import math

import numpy as np

SQRT_2_OVER_PI = 0.7978845608028654


def stored_values(a, dtype):
    """The generator's stored array (float32, or int16 bit patterns of bf16/fp16) as exact float64 values."""
    if dtype == "fp32":
        return a.astype(np.float64)
    if dtype == "fp16":
        return a.view(np.float16).astype(np.float64)
    return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


_erf = np.vectorize(math.erf, otypes=[np.float64])

ACTIVATIONS = {
    # F.gelu: the exact (erf) GeLU, what Megatron runs without bias_gelu_fusion
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    # fused_bias_gelu.bias_gelu (bias_gelu_fusion, the default with add_bias_linear): tanh approximation
    "fused_gelu": lambda x: x * 0.5 * (1.0 + np.tanh(0.79788456 * x * (1 + 0.044715 * x * x))),
    # megatron.legacy.model.utils.openai_gelu / gelu_impl
    "openai_gelu": lambda x: 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * np.power(x, 3.0)))),
    "squared_relu": lambda x: np.maximum(x, 0.0) ** 2,
}


def activation_of(args):
    """Which activation Megatron's MLP applies, from the saved args (legacy ParallelMLP order: openai_gelu,
    squared_relu, then F.gelu, fused into bias_gelu when bias_gelu_fusion; the fusion is off without biases)."""
    if args.swiglu:
        return "swiglu"
    if args.openai_gelu:
        return "openai_gelu"
    if args.squared_relu:
        return "squared_relu"
    return "fused_gelu" if args.bias_gelu_fusion and args.add_bias_linear else "gelu"


def norm(args, x, w, b=None):
    eps = args.layernorm_epsilon
    if args.normalization == "RMSNorm":
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rope(args, t, positions):
    """apply_rotary_pos_emb (non-interleaved): t * cos + rotate_half(t) * sin, freqs duplicated
    [f; f] over the head dim; t: [seq, heads, head_dim]."""
    assert not args.rotary_interleaved and args.rotary_percent == 1.0 and not args.use_rope_scaling
    dim = t.shape[-1]
    inv_freq = 1.0 / (args.rotary_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    freqs = np.outer(positions, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]
    x1, x2 = t[..., :dim // 2], t[..., dim // 2:]
    return t * np.cos(emb) + np.concatenate([-x2, x1], axis=-1) * np.sin(emb)


def linear(x, full, name):
    y = x @ full[name + ".w"].T
    return y + full[name + ".b"] if name + ".b" in full else y


def attention(args, x, full, p):
    """SelfAttention: fused QKV viewed as [ng, (np/ng + 2) * hn], split into q heads / k / v per group,
    rope on q and k, k and v repeated for each query head of the group, softmax(q k^T / sqrt(hn)) with the
    causal mask, linear_proj."""
    nq, hn = args.num_attention_heads, args.kv_channels
    ng = args.num_query_groups if args.group_query_attention else nq
    qpg, s = nq // ng, x.shape[0]
    qkv = linear(x, full, p + "qkv").reshape(s, ng, qpg + 2, hn)
    q = qkv[:, :, :qpg].reshape(s, nq, hn)
    k, v = qkv[:, :, qpg], qkv[:, :, qpg + 1]
    if args.qk_layernorm:  # q_layernorm / k_layernorm over each head's hn values, before rope
        q, k = norm(args, q, full[p + "qn.w"]), norm(args, k, full[p + "kn.w"])
    if args.position_embedding_type == "rope":
        q, k = rope(args, q, np.arange(s)), rope(args, k, np.arange(s))
    k, v = np.repeat(k, qpg, axis=1), np.repeat(v, qpg, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hn)
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    ctx = np.einsum("hqk,khd->qhd", probs, v).reshape(s, nq * hn)
    return linear(ctx, full, p + "proj")


def mlp(args, x, full, p, act):
    h = linear(x, full, p + "fc1")
    if act == "swiglu":
        gate, up = np.split(h, 2, axis=-1)
        h = gate / (1.0 + np.exp(-gate)) * up
    else:
        h = ACTIVATIONS[act](h)
    return linear(h, full, p + "fc2")


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def moe(args, x, full, p, pre_softmax):
    """MoELayer with TopKRouter (moe_utils.topk_routing_with_score_function, score function softmax): router
    logits x W^T; pre-softmax: softmax over all experts, then the top k probabilities as they are; else the top
    k logits, then their softmax.  Each token's output is the sum of its k experts' SwiGLU MLPs (fc1 = [gate;
    up]) weighted by those probabilities (no capacity limit, no token dropped), plus the shared experts' MLP
    (shared_experts.py SharedExpertMLP, with its sigmoid gate when moe_shared_expert_gate)."""
    router = x @ full[p + "router.w"].T
    k = args.moe_router_topk
    top = np.argsort(-router, axis=-1, kind="stable")[:, :k]
    chosen = np.take_along_axis(softmax(router) if pre_softmax else router, top, axis=-1)
    weights = chosen if pre_softmax else softmax(chosen)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(top[t], weights[t]):
            out[t] += w * mlp(args, x[t:t + 1], full, f"{p}x{e}.", "swiglu")[0]
    if args.moe_shared_expert_intermediate_size:  # SharedExpertMLP, added to the routed experts' output
        shared = mlp(args, x, full, p + "shared.", "swiglu")
        if getattr(args, "moe_shared_expert_gate", False):  # scaled by sigmoid(x . gate_weight)
            shared = shared / (1.0 + np.exp(-(x @ full[p + "shared.gate.w"].T)))
        out += shared
    return out


def is_moe_layer(args, g):
    if not args.num_experts:
        return False
    freq = args.moe_layer_freq
    return g % freq == 0 if isinstance(freq, int) else bool(freq[g])


def logits(args, full, tokens, act=None, pre_softmax=None):
    """Logits [batch, seq, args.vocab_size] of the GPT model (pre-norm layers, final norm, output layer or
    the word embeddings when tied, padded-vocab logits cut to the true vocab).  ``act`` overrides the
    activation and ``pre_softmax`` the router's moe_router_pre_softmax (the generator's sensitivity checks)."""
    act = act or activation_of(args)
    assert not args.apply_residual_connection_post_layernorm and not args.layernorm_zero_centered_gamma
    out = []
    for seq in np.asarray(tokens):
        x = full["emb"][seq]
        if args.position_embedding_type == "learned_absolute":
            x = x + full["pos"][np.arange(len(seq))]
        for g in range(args.num_layers):
            p = f"L{g}."
            x = x + attention(args, norm(args, x, full[p + "ln1.w"], full.get(p + "ln1.b")), full, p)
            h = norm(args, x, full[p + "ln2.w"], full.get(p + "ln2.b"))
            if is_moe_layer(args, g):
                x = x + moe(args, h, full, p, args.moe_router_pre_softmax if pre_softmax is None else pre_softmax)
            else:
                x = x + mlp(args, h, full, p, act)
        x = norm(args, x, full["final.w"], full.get("final.b"))
        head = full["emb"] if not args.untie_embeddings_and_output_weights else full["out"]
        out.append((x @ head.T)[:, :args.vocab_size])
    return np.stack(out)
