"""gen_megatron_core's cases: Megatron-LM command lines (pretrain_gpt.py's arguments) of tiny models.

Every model: bf16 parameters, rope, RMSNorm, SwiGLU, no linear biases, untied output layer, GQA (4 heads in 2
groups), hidden 32, 2 layers, weights drawn at std 0.2 (~1/sqrt(hidden): attention and the router far from
uniform, logits of order 1-10 rather than the 0.4 of Megatron's default 0.02), NullTokenizer of 60 tokens padded
to 64 (make-vocab-size-divisible-by 32 x TP), the local (non-Transformer-Engine) layer spec, no dropout (Qwen3's and
Mixtral's), CPU initialisation, Adam.
"""

VOCAB = 60  # the true vocabulary; padded to 64
COMMON = [
    "--hidden-size", "32", "--num-attention-heads", "4", "--num-query-groups", "2",
    "--seq-length", "16", "--max-position-embeddings", "64", "--micro-batch-size", "1",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "32",
    "--bf16", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
    "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
    "--attention-dropout", "0", "--hidden-dropout", "0", "--init-method-std", "0.2",
    "--transformer-impl", "local", "--use-cpu-initialization", "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
    "--distributed-backend", "gloo", "--lr", "1e-3", "--train-iters", "10", "--save-interval", "1", "--seed", "7",
]
# Qwen3: q/k RMSNorm, head_dim 12 != hidden / heads (8), rope base 1e6
QWEN3 = ["--qk-layernorm", "--kv-channels", "12", "--rotary-base", "1000000"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16"]
QWEN3_MOE = ["--num-layers", "2", "--ffn-hidden-size", "64"] + QWEN3 + MOE
# Mixtral: no q/k norms, head_dim = hidden / heads, rope base 1e6
MIXTRAL = ["--num-layers", "2", "--ffn-hidden-size", "64", "--rotary-base", "1000000"] + MOE
QWEN3_DENSE = ["--num-layers", "2", "--ffn-hidden-size", "64"] + QWEN3


def parallel(tp=1, pp=1, ep=1, etp=None, dp=1):
    """(world size, arguments); the global batch is one micro batch per data-parallel rank."""
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--expert-model-parallel-size", str(ep), "--global-batch-size", str(dp)]
    if etp is not None:
        args += ["--expert-tensor-parallel-size", str(etp)]
    return tp * pp * dp, args


def case(model, family, fmt, tp=1, pp=1, ep=1, etp=None, dp=1, extra=(), masters=True, refused=None):
    world, par = parallel(tp, pp, ep, etp, dp)
    return {"model": model, "family": family, "format": fmt, "world": world, "tp": tp, "pp": pp, "ep": ep,
            "etp": tp if etp is None else etp, "dp": dp, "vocab": VOCAB, "masters": masters, "refused": refused,
            "args": COMMON + model + par + list(extra) + ["--ckpt-format", fmt]}


# name -> case; "masters": the fp32 masters can be read back at world size 1 (non-distributed optimizer);
# "refused": why ckptfs must refuse the save (no expectations written)
CASES = {
    "qwen3moe_torch_dist_tp2_ep2_etp2": case(QWEN3_MOE, "Qwen3-MoE", "torch_dist", tp=2, ep=2, etp=2, dp=2),
    "qwen3moe_torch_dist_pp2_ep2": case(QWEN3_MOE, "Qwen3-MoE", "torch_dist", pp=2, ep=2, dp=2),
    "mixtral_torch_dist_pp2_ep2": case(MIXTRAL, "Mixtral", "torch_dist", pp=2, ep=2, dp=2),
    "mixtral_legacy_ep2": case(MIXTRAL, "Mixtral", "torch", ep=2, dp=2),
    "qwen3_torch_dist_tp2_pp2": case(QWEN3_DENSE, "Qwen3", "torch_dist", tp=2, pp=2),
    "qwen3_legacy_tp2_pp2": case(QWEN3_DENSE, "Qwen3", "torch", tp=2, pp=2),
    # ChainedOptimizer of two DistributedOptimizers (dense, expert), dp_reshardable: chained_N. keys
    "qwen3moe_torch_dist_ep2_distopt": case(QWEN3_MOE, "Qwen3-MoE", "torch_dist", ep=2, dp=2,
                                            extra=["--use-distributed-optimizer"], masters=False),
    # legacy format, expert TP 2 != TP 1: the two expert-TP ranks of an EP rank write the same mp_rank_00_00E file
    # (model only, --no-save-optim: the fixtures stay under 8 MB)
    "qwen3moe_legacy_tp1_etp2_ep2": case(QWEN3_MOE, "Qwen3-MoE", "torch", ep=2, etp=2, dp=4, masters=False,
                                         extra=["--no-save-optim"], refused="expert tensor parallelism"),
    # a dense first layer (moe_layer_freq), shared experts, the router's fp32 expert bias (sigmoid scores, updated
    # by Megatron's aux-loss-free rule from drawn token counts): no Hugging Face family computes this model; model
    # only (--no-save-optim), for size
    "moe_mixed_shared_bias_torch_dist_ep2": case(
        ["--num-layers", "2", "--ffn-hidden-size", "64"] + QWEN3 + MOE + [
            "--moe-layer-freq", "[0,1]", "--moe-shared-expert-intermediate-size", "16",
            "--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid"],
        "Qwen3-MoE with a dense layer, shared experts and expert bias", "torch_dist", ep=2, dp=2,
        extra=["--no-save-optim"], masters=False),
    # Qwen2-MoE: q/k/v biases, no q/k norms, a shared expert scaled by its sigmoid gate, softmax over all experts
    # before the top-k (unnormalised weights, Qwen2-MoE's norm_topk_prob false); model only, for size
    "qwen2moe_torch_dist_ep2": case(
        ["--num-layers", "2", "--ffn-hidden-size", "64", "--add-qkv-bias", "--rotary-base", "1000000"] + MOE + [
            "--moe-shared-expert-intermediate-size", "16", "--moe-shared-expert-gate", "--moe-router-pre-softmax"],
        "Qwen2-MoE", "torch_dist", ep=2, dp=2, extra=["--no-save-optim"], masters=False),
}
