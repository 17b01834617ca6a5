"""The state-dict layout of a tiny Llama, shared by the fixture generators (gen/generate.py for DeepSpeed,
gen_dcp/generate_dcp.py for DCP): every tensor's name, shape and role, in state_dict order, in Hugging Face's
(``hf``, LlamaForCausalLM: untied lm_head, no biases) or torchtitan's (``tt``) parameter names.  Standard
library only: gen_dcp/run_generator.py copies it beside generate_dcp.py in the chroot."""

NAMES = {  # embedding, layer prefix, the layer's two norms, final norm, output head
    "hf": ("model.embed_tokens.weight", "model.layers.{}.",
           ("input_layernorm.weight", "post_attention_layernorm.weight"), "model.norm.weight", "lm_head.weight"),
    "tt": ("tok_embeddings.weight", "layers.{}.", ("attention_norm.weight", "ffn_norm.weight"), "norm.weight",
           "output.weight"),
}
MATRICES = {  # a layer's matrices in state_dict order: (name, which of q k v o gate up down)
    "hf": (("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v"), ("self_attn.o_proj", "o"),
           ("mlp.gate_proj", "gate"), ("mlp.up_proj", "up"), ("mlp.down_proj", "down")),
    "tt": (("attention.wq", "q"), ("attention.wk", "k"), ("attention.wv", "v"), ("attention.wo", "o"),
           ("feed_forward.w1", "gate"), ("feed_forward.w2", "down"), ("feed_forward.w3", "up")),
}


def llama_tensors(names, dim, kv, ffn, vocab, layers):
    """[(name, shape, role, layer)]: role "embed", "matrix", "norm" or "head"; layer None outside the layers.
    ``kv``: the k/v projections' rows (head dim x KV heads)."""
    embed, prefix, norms, final_norm, head = NAMES[names]
    shape_of = {"q": (dim, dim), "k": (kv, dim), "v": (kv, dim), "o": (dim, dim), "gate": (ffn, dim),
                "up": (ffn, dim), "down": (dim, ffn)}
    out = [(embed, (vocab, dim), "embed", None)]
    for l in range(layers):
        p = prefix.format(l)
        out += [(p + k + ".weight", shape_of[which], "matrix", l) for k, which in MATRICES[names]]
        out += [(p + n, (dim,), "norm", l) for n in norms]
    return out + [(final_norm, (dim,), "norm", None), (head, (vocab, dim), "head", None)]
