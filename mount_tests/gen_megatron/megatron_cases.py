"""The synthetic Megatron-LM cases (legacy ``--ckpt-format torch`` save dirs) and their sizes.

Standard library only, so that the tests can import the case list cheaply.  Each case is a dict; the keys
(all present after ``complete()``):

  name        case folder name
  tp, pp, vp  tensor / pipeline / virtual-pipeline sizes; dp: data-parallel size (only args change)
  dtype       training dtype: bf16 / fp16 / fp32
  naming      'core' (megatron.core flat names) or 'legacy' (nested language_model dicts)
  spec        'local' (input_layernorm / pre_mlp_layernorm) or 'te' (linear_qkv.layer_norm_weight ...)
  hidden, layers, heads, groups (None = MHA), ffn, vocab (true vocab), max_pos
  swiglu, norm ('RMSNorm' / 'LayerNorm'), pos ('rope' / 'learned_absolute'), bias (add_bias_linear),
  qkv_bias (add_qkv_bias), tied, rotary_base
  act         non-gated MLP activation, as the args select it: 'gelu' (erf: bias_gelu_fusion off),
              'fused_gelu' (bias_gelu_fusion on: Megatron's bias_gelu, tanh approximation), 'openai_gelu'
              (tanh approximation), 'squared_relu' (no Hugging Face counterpart)
  iterations  list of ints, or ['release']; the last one is what the tracker names
  first_stage decoder_first_pipeline_num_layers (uneven pipeline split; None = even)
  dist_opt    distributed optimizer (distrib_optim.pt per rank dir)
  stale       the stored bf16/fp16 model is NOT the rounded fp32 master (master = model + noise), so a
              view served from the wrong source shows
  optimizer   False: no optimizer / rng in the files (a converted 'release' checkpoint)
  tokenizer   tokenizer files written in the save dir root
"""

DEFAULTS = dict(tp=1, pp=1, vp=1, dp=1, dtype="bf16", naming="core", spec="local", hidden=64, layers=4,
                heads=8, groups=2, ffn=96, vocab=250, max_pos=64, swiglu=True, norm="RMSNorm", pos="rope",
                bias=False, qkv_bias=False, tied=False, rotary_base=10000, iterations=[3], first_stage=None,
                dist_opt=False, stale=False, optimizer=True, tokenizer=False, act="gelu")

# GPT-2-like: LayerNorm with biases, learned absolute positions, gelu MLP, MHA, biases everywhere
GPT = dict(swiglu=False, norm="LayerNorm", pos="learned_absolute", bias=True, groups=None, ffn=128)

CASES = [
    # Llama-style, TP=1 PP=1 (the plain case), tokenizer files beside the iteration dirs
    dict(name="llama_tp1_pp1", tokenizer=True, rotary_base=500000),
    # the real fixture's shape: TP2 PP2, GQA, local spec, untied, DP 4 (args only)
    dict(name="llama_tp2_pp2_dp4", tp=2, pp=2, dp=4, hidden=80, heads=8, groups=2, ffn=112),
    # TE spec, GQA with 4 groups over TP4, q/k/v biases (Qwen2-like), tied, stale bf16 copy
    dict(name="te_qkvbias_tp4_tied", tp=4, spec="te", groups=4, qkv_bias=True, tied=True, stale=True),
    # GPT-2-like, fp16 with a grad scaler, tied embeddings over PP2 (output_layer copy on the last stage),
    # Megatron's default fused bias-GeLU (tanh approximation)
    dict(name="gpt_fp16_tp2_pp2_tied", tp=2, pp=2, dtype="fp16", tied=True, act="fused_gelu", **GPT),
    # virtual pipeline: model0/model1 per file, layer numbers restart per chunk, VP-major order
    dict(name="vp2_tp2_pp2", tp=2, pp=2, vp=2, layers=8),
    # VP2 x PP4, TE spec, MHA, tied with the copy on the last chunk of the last stage
    dict(name="vp2_tp1_pp4_te_tied", pp=4, vp=2, layers=8, spec="te", groups=None, tied=True),
    # uneven pipeline split: 3 layers on stage 0, then 1 each
    dict(name="uneven_tp2_pp4", tp=2, pp=4, layers=6, first_stage=3),
    # distributed optimizer, DP 2, hidden 80 (1-D params are not multiples of 64: alignment gaps)
    dict(name="distopt_tp2_dp2", tp=2, dp=2, hidden=80, heads=8, groups=2, ffn=112, dist_opt=True),
    # distributed optimizer with tied embeddings over PP2 and VP2 (shared-embedding buckets, one
    # buffer per model chunk), stale bf16 copy
    dict(name="distopt_tp2_pp2_vp2_tied", tp=2, pp=2, vp=2, layers=4, dist_opt=True, tied=True, stale=True,
         hidden=80, ffn=112),
    # legacy (non-core) nested naming, Llama-style
    dict(name="legacy_tp2_pp2_llama", tp=2, pp=2, naming="legacy"),
    # legacy naming, GPT-2-like, tied over PP2 (word_embeddings_for_head), TP4 over 8 MHA heads
    dict(name="legacy_gpt_tp4_pp2_tied", tp=4, pp=2, naming="legacy", tied=True, act="openai_gelu", **GPT),
    # fp32 training (no fp32_from_fp16_params: the fp32 view is the model), FP32 optimizer
    dict(name="fp32_tp2_pp2_gelu", tp=2, pp=2, dtype="fp32", spec="te", **GPT),
    # a converted checkpoint: tracker 'release', no optimizer or rng state, fp32
    dict(name="release_fp32_tp2", tp=2, dtype="fp32", iterations=["release"], optimizer=False),
    # two iterations; the tracker names the later one
    dict(name="two_iters_tp2", tp=2, iterations=[2, 5], spec="te"),
    # GPT-2-like with 8 MiB fc weights (column- and row-parallel over TP2): hf/ serves them transposed, 8x
    # the transposed-tensor cache that test_megatron.py mounts with (-o transpose_cache_mb=1)
    dict(name="gpt_wide_fc_tp2", tp=2, layers=1, **dict(GPT, hidden=256, heads=4, ffn=16384)),
    # no Hugging Face family: GPT-2-like but with a squared-ReLU MLP (--squared-relu) ...
    dict(name="gpt_sqrelu_tp2", tp=2, act="squared_relu", **GPT),
    # ... and GeLU + LayerNorm with rotary positions and GQA (neither Llama nor GPT-2)
    dict(name="gelu_rope_gqa_tp2", tp=2, **dict(GPT, pos="rope", groups=2)),
]


# Bench-only cases (bench/megatron_bench.sh writes their checkpoint/ without expectations or self-check):
# NOT in CASES, so neither the tests nor generate.py (default or --only) ever generate them.  Llama-style
# bf16 TP=4 x PP=2, GQA 32 heads / 8 groups, 22 layers: a 2.25 GB bf16 model (1.124e9 parameters, padded
# vocab 32,256), ~15.7 GB of rank files with the non-distributed optimizer (fp32 masters and both Adam
# moments in model_optim_rng.pt), the same in distrib_optim.pt with the distributed one.
BENCH_LLAMA = dict(tp=4, pp=2, dp=1, hidden=2048, layers=22, heads=32, groups=8, ffn=5632, vocab=32000,
                   max_pos=4096, rotary_base=500000, iterations=[1000])
# GPT-2-style bf16 TP=2, one layer of hidden 2304 / ffn 9216: its hf/ view transposes every linear weight
# (Conv1D), the merged fc1 source alone 42 MB (bench/megatron_bench.sh --gpt2).
BENCH_GPT2 = dict(GPT, tp=2, hidden=2304, layers=1, heads=24, ffn=9216, vocab=1000, max_pos=64, iterations=[1000])
BENCH_CASES = [
    dict(name="bench_llama_tp4_pp2", **BENCH_LLAMA),
    dict(name="bench_llama_tp4_pp2_distopt", dist_opt=True, **BENCH_LLAMA),
    dict(name="bench_gpt2_tp2", **BENCH_GPT2),
]


def bench_cases():
    return [complete(c) for c in BENCH_CASES]


def complete(case):
    c = dict(DEFAULTS)
    c.update(case)
    c["iterations"] = list(c["iterations"])
    return c


def all_cases():
    return [complete(c) for c in CASES]


def iter_dir_name(it):
    return "release" if it == "release" else "iter_%07d" % it


def is_llama_style(case):
    """Llama / Qwen2: swiglu + rope + RMSNorm, no biases on the linear layers (q/k/v biases allowed)."""
    return case["swiglu"] and case["pos"] == "rope" and case["norm"] == "RMSNorm" and not case["bias"]


GELU_ACTS = ("gelu", "fused_gelu", "openai_gelu")


def is_gpt2_style(case):
    """GPT-2: GeLU (erf or tanh approximation) + learned absolute positions + LayerNorm, biases on every
    linear layer, multi-head attention."""
    return (not case["swiglu"] and case["act"] in GELU_ACTS and case["pos"] == "learned_absolute"
            and case["norm"] == "LayerNorm" and case["bias"] and case["groups"] is None)


# ----------------------------------------------------------------------------------------------------
# MoE / expert parallelism and torch_dist (appended; the keys above keep their meaning).  More keys:
#   experts       num_experts (0: dense MLP); every layer is an MoE layer (moe_layer_freq 1)
#   ep            expert_model_parallel_size (expert_tensor_parallel_size = tp); rank dirs get _EEE when > 1
#   moe_ffn       moe_ffn_hidden_size; topk: moe_router_topk
#   grouped_gemm  moe_grouped_gemm: TEGroupedMLP (linear_fc1.weight{e}) instead of SequentialMLP
#                 (local_experts.{e}.linear_fc1.weight); needs the TE spec
#   ckpt_format   'torch' (legacy rank files) or 'torch_dist' (written by torch.distributed.checkpoint in the
#                 Debian 13 chroot, see megatron_dist.py)
DEFAULTS.update(experts=0, ep=1, moe_ffn=None, topk=2, grouped_gemm=False, ckpt_format="torch")

MOE = dict(experts=4, moe_ffn=32, layers=2)

CASES += [
    # EP2 x PP2, SequentialMLP, local spec: rank dirs mp_rank_00_PPP_EEE, two local experts per EP rank
    dict(name="moe_seq_ep2_tp1_pp2", pp=2, ep=2, dp=2, **MOE),
    # EP2 x TP2, TEGroupedMLP (linear_fc1.weight{e}), TE spec: mp_rank_TT_EEE
    dict(name="moe_grouped_ep2_tp2_te", tp=2, ep=2, dp=2, spec="te", grouped_gemm=True, **MOE),
    # EP1 x TP2, 4 experts, SequentialMLP: no EP suffix
    dict(name="moe_seq_ep1_tp2", tp=2, **MOE),
    # torch_dist: the real fixture's shape (TP2 PP2, local spec, GQA, SwiGLU, bf16 + optimizer)
    dict(name="dist_llama_tp2_pp2", ckpt_format="torch_dist", tp=2, pp=2, hidden=80, ffn=112),
    # torch_dist, TP4, TE spec, GPT-2-like (MHA, gelu, biases everywhere, learned_absolute positions)
    dict(name="dist_gpt_tp4_te", ckpt_format="torch_dist", tp=4, spec="te", **GPT),
    # torch_dist, TP1 PP2, tied embeddings (the last stage's copy is a replica: not stored)
    dict(name="dist_tied_tp1_pp2", ckpt_format="torch_dist", pp=2, tied=True, spec="te"),
    # torch_dist, fp32 training, no optimizer / rng state
    dict(name="dist_fp32_tp2_noopt", ckpt_format="torch_dist", tp=2, dtype="fp32", optimizer=False),
]


# ----------------------------------------------------------------------------------------------------
# older save layouts (appended).  More keys:
#   distopt_layout  distrib_optim.pt of the distributed optimizer, by Megatron era:
#                   'coalesced'  core 0.7+: {'buckets_coalesced': True, chunk: {(param dtype, grad dtype):
#                                {'param', 'exp_avg', 'exp_avg_sq': one compact tensor, 'numel_unpadded'}}},
#                                starts 64-aligned (core 0.8+), bucket-end padding stripped
#                   'buckets'    core 0.6 (0.4/0.5 key the entry by the grad dtype alone):
#                                {'per_bucket_numel': [{key: [padded bucket sizes]} per buffer],
#                                'per_bucket_numel_unpadded': [...], chunk: {(param dtype, torch.float32):
#                                {'param': [one tensor per bucket], ...}}}, unaligned starts, each bucket
#                                padded at its end to a multiple of DP (GradBuffer / ParamAndGradBuffer
#                                _pad_if_needed of core 0.4-0.6; lcm(DP, 128) only from core 0.7, whose file
#                                strips the padding)
#                   'padded'     2023-05 (Megatron-LM 49e4bd6857b7): {chunk: {torch.float32: {'param': T, ...}}},
#                                T = the whole grad buffer, forward params packed from its end backwards
#                                (= reverse order from 0), unaligned, padded at its end to a multiple of DP
#   common          torch_dist: 'file' (common.pt + metadata.json with common_backend, core <= 0.18) or
#                   'dcp' (core 0.19+: no common.pt; the common state is the DCP bytes item
#                   common_state/shard_0_1 = torch.save([common state dict]) written by rank 0,
#                   metadata.json {"sharded_backend": "torch_dist", "sharded_backend_version": 1} only)
DEFAULTS.update(distopt_layout="coalesced", common="file")

CASES += [
    # core 0.6 list of buckets: VP2 (one buffer per model chunk: two entries in each file's per_bucket_numel),
    # DP 4, GPT-2-like with an odd fc1 bias (45 per TP rank) so every bucket has end padding, stale bf16 copy
    dict(name="distopt_buckets_tp2_pp2_vp2", tp=2, pp=2, vp=2, layers=4, dp=4, dist_opt=True,
         distopt_layout="buckets", stale=True, **dict(GPT, hidden=48, heads=6, ffn=90)),
    # 2023-05 single padded buffer: TP2 PP2 DP4, fp16 (grad scaler), GPT-2-like, stale fp16 copy; every
    # buffer's total is 2 mod 4: two padding elements at its end
    dict(name="distopt_padded2023_tp2_pp2", tp=2, pp=2, dp=4, dtype="fp16", dist_opt=True, distopt_layout="padded",
         stale=True, **dict(GPT, hidden=54, heads=6, ffn=100)),
    # torch_dist of core 0.19+: the common state inside the DCP (common_state/shard_0_1), no common.pt
    dict(name="dist_common_state_tp2", ckpt_format="torch_dist", tp=2, common="dcp"),
]

# Gradient buckets (appended):
#   overlap_grad_reduce  args.overlap_grad_reduce: with the distributed optimizer each buffer is split into
#                        buckets that close right after the param bringing the bucket to >= ddp_bucket_size
#                        elements; distrib_optim.pt keeps each bucket without its end padding, so the next
#                        bucket starts where the previous one's last param ended (no alignment gap).  Megatron
#                        keeps a single bucket on PP ranks > 0 and VP chunks > 0 (megatron_layout.bucket_size).
#   ddp_bucket_size      args.ddp_bucket_size (None: Megatron's default max(40e6, 1e6 x DP) elements)
DEFAULTS.update(overlap_grad_reduce=False, ddp_bucket_size=None)

CASES += [
    # core 0.7+ coalesced distrib_optim.pt with overlap_grad_reduce and 5000-element buckets: TP2 PP1 DP2 (no
    # VP: every buffer bucketed), hidden 72 / 6 heads / ffn 100 so no weight shard is a multiple of 64 elements
    # (the embedding and output layer excepted): 10 buckets per rank, each boundary moving every later offset
    # off the single-bucket layout (megatron_check asserts that numel_unpadded rules the single bucket out),
    # stale bf16 copy
    dict(name="distopt_overlap_buckets_tp2_dp2", tp=2, dp=2, hidden=72, heads=6, groups=2, ffn=100, dist_opt=True,
         overlap_grad_reduce=True, ddp_bucket_size=5000, stale=True),    # core 0.6 list of buckets with several buckets per buffer: tied over PP2 (the shared embedding's bucket
    # of its own on both stages) and overlap_grad_reduce with 3000-element buckets on stage 0, DP 4 (each
    # bucket padded at its end), GPT-2-like with odd sizes, stale bf16 copy
    dict(name="distopt_buckets_tied_overlap_tp2_pp2", tp=2, pp=2, layers=4, dp=4, dist_opt=True,
         distopt_layout="buckets", tied=True, overlap_grad_reduce=True, ddp_bucket_size=3000, stale=True,
         **dict(GPT, hidden=48, heads=6, ffn=90)),
]

# torch_dist with the distributed optimizer (appended); DP 1.  More keys:
#   dist_optim_sharding  'dp_reshardable' (megatron-core's default since 0.15: per model-parallel domain and
#                        gradient bucket a 1-D tensor of the compact buffer, one DCP chunk per parameter and per
#                        alignment gap, megatron_dist.declare_buckets) or 'dp_zero_gather_scatter' (core 0.7-0.14:
#                        per domain the ShardedObject param_state, distrib_optim.pt's coalesced dict,
#                        megatron_dist.declare_param_state)
DEFAULTS.update(dist_optim_sharding="dp_reshardable")

CASES += [
    # the real fixture's shape (TP2 PP2, local spec, GQA, SwiGLU; hidden 80: norms leave alignment gaps), stale
    dict(name="dist_distopt_tp2_pp2", ckpt_format="torch_dist", tp=2, pp=2, hidden=80, ffn=112, dist_opt=True,
         stale=True),
    # TE spec, tied over PP2 (shared-embedding buckets), uneven split (3 layers, then 1), overlap_grad_reduce
    # with 5000-element buckets on stage 0, core 0.19's common state in the DCP
    dict(name="dist_distopt_tied_uneven_buckets", ckpt_format="torch_dist", tp=2, pp=2, layers=4, first_stage=3,
         spec="te", tied=True, dist_opt=True, overlap_grad_reduce=True, ddp_bucket_size=5000, hidden=72, heads=6,
         groups=2, ffn=100, stale=True, common="dcp"),
    # dp_zero_gather_scatter, TE spec, GPT-2-like (biases, learned positions), TP2 PP2, stale
    dict(name="dist_distopt_gather_tp2_pp2", ckpt_format="torch_dist", tp=2, pp=2, spec="te", dist_opt=True,
         dist_optim_sharding="dp_zero_gather_scatter", stale=True, **GPT),
]


def is_moe(case):
    return bool(case["experts"])


def is_torch_dist(case):
    return case["ckpt_format"] == "torch_dist"


def is_moe_layer(case, g):
    """Layer g's MLP is an MoE layer: Megatron's moe_layer_freq, an int n (every n-th layer from layer 0) or a
    0/1 list (gpt_layer_specs.py)."""
    if not case["experts"]:
        return False
    freq = case["moe_freq"]
    return g % freq == 0 if isinstance(freq, int) else bool(freq[g])


def hf_family(case):
    """'llama' (LlamaForCausalLM / Qwen2ForCausalLM), 'gpt2' (GPT2LMHeadModel), for MoE 'qwen2_moe' (gated
    shared experts), 'qwen3_moe' (q/k layernorm; dense layers as mlp_only_layers; norm_topk_prob off with
    pre_softmax) or 'mixtral' (no q/k layernorm, every layer MoE, top-k renormalised), or None: no hf/ view."""
    if is_moe(case):
        if case["expert_bias"] or case["router_score"] != "softmax":
            return None
        if case["shared_ffn"]:
            return "qwen2_moe" if case["shared_gate"] and not case["qk_norm"] else None
        if case["qk_norm"]:
            return "qwen3_moe"
        every = all(is_moe_layer(case, g) for g in range(case["layers"]))
        return "mixtral" if every and not case["pre_softmax"] else None
    assert not case["qk_norm"], "q/k layernorm only in MoE cases (Qwen3-MoE)"
    return "llama" if is_llama_style(case) else "gpt2" if is_gpt2_style(case) else None


def has_hf(case):
    return hf_family(case) is not None

# MoE with the distributed optimizer (appended): distrib_optim.pt is the ChainedOptimizer's LIST [dense state,
# expert state], each a coalesced dict (one buffer per model chunk) over that optimizer's params only (reverse
# named_parameters order among them, 64-aligned starts); the dense entry is None in the EP rank > 0 dirs (their
# writer is not dense DP rank 0), whose dense masters come from EP rank 0's file
CASES += [
    # EP2 x TP2, DP 2 (expert DP 1), SequentialMLP, local spec, stale bf16 copy; hidden 80 (the norms leave
    # alignment gaps in the dense buffer) and moe_ffn 36 (linear_fc2 shards [80, 18]: gaps in the expert buffer)
    dict(name="moe_distopt_ep2_tp2", tp=2, ep=2, dp=2, dist_opt=True, stale=True, hidden=80, heads=8, groups=2,
         **dict(MOE, moe_ffn=36)),
]

# torch_dist at data parallel > 1 (appended): world TP x DP x PP, global rank tp + TP * (dp + DP * pp).  Megatron's
# fully parallel save spreads the model's shards over the DP replicas' files (megatron_dist.saving_dp_ranks), so
# .metadata's key order is not the state dict's; with the distributed optimizer each DP rank writes its own
# slice of every dp_reshardable bucket (megatron_dist.dp_slices), so a domain's buckets are pieced together from
# several files; dp_zero_gather_scatter's param_state is gathered on, and written by, DP rank 0.
CASES += [
    # the shape of the real TP2 x DP2 save (hidden 48) that showed .metadata's order is not the model's: local
    # spec, untied, dp_reshardable, stale; .metadata lists the layers, then output_layer, then the embedding
    dict(name="dist_distopt_tp2_dp2", ckpt_format="torch_dist", tp=2, dp=2, hidden=48, heads=6, groups=2, ffn=112,
         dist_opt=True, stale=True),
    # PP2 x DP4 (TP1), TE spec, GPT-2-like, overlap_grad_reduce with 3000-element buckets on stage 0: every bucket
    # cut into four DP slices
    dict(name="dist_distopt_pp2_dp4_buckets", ckpt_format="torch_dist", pp=2, dp=4, spec="te", dist_opt=True,
         overlap_grad_reduce=True, ddp_bucket_size=3000, stale=True, **GPT),
    # TP2 x DP4, overlap_grad_reduce with 4000-element buckets, GQA, hidden 72 (norms leave alignment gaps, weight
    # shards no multiple of 64): bucket edges, parameter edges and gaps fall inside every DP rank's slice
    dict(name="dist_distopt_tp2_dp4_buckets", ckpt_format="torch_dist", tp=2, dp=4, hidden=72, heads=6, groups=2,
         ffn=100, dist_opt=True, overlap_grad_reduce=True, ddp_bucket_size=4000, stale=True),
    # TP2 x PP2 x DP2, dp_zero_gather_scatter (param_state of DP rank 0), the model spread over both replicas
    dict(name="dist_distopt_gather_tp2_pp2_dp2", ckpt_format="torch_dist", tp=2, pp=2, dp=2, dist_opt=True,
         dist_optim_sharding="dp_zero_gather_scatter", stale=True, hidden=80, ffn=112),
    # fully_sharded_model_space (core 0.8-0.14's default with fully parallel saving): per DP rank its range of
    # each parameter, flattened, under optimizer.state.fp32_param.<key> (megatron_dist.declare_flattened_masters);
    # TP2 x DP2, SwiGLU (fc1 ranges cut at the gate/up half), overlap_grad_reduce 3000-element buckets, stale
    dict(name="dist_distopt_fs_model_space_tp2_dp2", ckpt_format="torch_dist", tp=2, dp=2, hidden=48, heads=6,
         groups=2, ffn=112, dist_opt=True, dist_optim_sharding="fully_sharded_model_space", overlap_grad_reduce=True,
         ddp_bucket_size=3000, stale=True),
    # TP2 x DP2, non-distributed optimizer: optimizer.state.fp32_param.* spread over the replicas too
    dict(name="dist_llama_tp2_dp2", ckpt_format="torch_dist", tp=2, dp=2, hidden=80, ffn=112),
]

# Qwen3-MoE and Mixtral (appended; legacy files, core naming).  More keys:
#   qk_norm      qk_layernorm: per-head RMSNorm of q and k ([kv_channels] weights, replicated over TP), before
#                rope (SelfAttention.get_query_key_value_tensors); with experts the model is Qwen3-MoE-style
#   moe_freq     moe_layer_freq: an int n (layer g is an MoE layer when g % n == 0) or a 0/1 list per layer; the
#                other layers have a dense SwiGLU MLP of ffn (Qwen3-MoE's mlp_only_layers; Mixtral has none)
#   pre_softmax  moe_router_pre_softmax: softmax over all experts, then the top k (weights not renormalised:
#                Qwen3-MoE's norm_topk_prob false); else the top k logits, then their softmax
# The MoE cases above (no q/k layernorm, every layer MoE) are Mixtral-style: their hf/ is MixtralForCausalLM.
#   expert_bias  moe_router_enable_expert_bias: the router's persistent float32 buffer mlp.router.expert_bias [E]
#                (no optimizer state), float32 in model.safetensors and fp32/ whatever the training dtype
#   shared_ffn   moe_shared_expert_intermediate_size (0: none): SharedExpertMLP mlp.shared_experts.linear_fc1/fc2
#                (a dense SwiGLU MLP, dense optimizer) in every MoE layer, its output added to the experts'
#   shared_gate  moe_shared_expert_gate: SharedExpertMLP.gate_weight [1, hidden] scales the shared output by
#                sigmoid(x . gate_weight) (a TransformerConfig field that Bridge's configs carry; Megatron-LM's
#                command line has no flag for it, so its saved args have it only where a caller set it)
#   router_score moe_router_score_function: 'softmax' or 'sigmoid' (no family of the table takes a sigmoid: no hf/)
#   no_hf_reason what inspect's "no hf/ view" note must say (the tests check it; "" for cases with hf/ or any reason)
DEFAULTS.update(qk_norm=False, moe_freq=1, pre_softmax=False, expert_bias=False, shared_ffn=0, shared_gate=False,
                router_score="softmax", no_hf_reason="")

CASES += [
    # Qwen3-MoE-style, EP2 x TP2, TE spec: layer 0 dense (the TE dense norm mlp.linear_fc1.layer_norm_weight,
    # mlp_only_layers [0]), layers 1-2 MoE; pre-softmax router; q/k norms; GQA 2 groups; 3 of 4 experts per token
    dict(name="qwen3moe_mixed_ep2_tp2_te", tp=2, ep=2, dp=2, spec="te", qk_norm=True, moe_freq=[0, 1, 1],
         pre_softmax=True, topk=3, **dict(MOE, layers=3)),
    # Mixtral-style but MoE every second layer (moe_layer_freq 2): Mixtral has no dense layers, so no hf/
    dict(name="moe_every2nd_ep2_no_hf", ep=2, moe_freq=2, no_hf_reason="Mixtral", **MOE),
    # Qwen3-MoE-style with the router's expert bias (bf16 model, float32 buffer), EP2 x TP2: no hf/ (neither
    # Qwen3-MoE's nor Mixtral's router adds a bias to the scores)
    # Qwen2-MoE-style: q/k/v biases, a gated shared expert (ffn 48) beside 4 routed experts, layer 1 dense, EP2 x
    # TP2 (the shared expert split over TP like a dense MLP, in the dense optimizer)
    dict(name="qwen2moe_shared_ep2_tp2", tp=2, ep=2, qkv_bias=True, shared_ffn=48, shared_gate=True,
         moe_freq=[1, 0, 1], **dict(MOE, layers=3)),
    # shared experts without the gate: Qwen2-MoE's shared expert is always gated, so no hf/
    dict(name="moe_ungated_shared_no_hf", ep=2, qkv_bias=True, shared_ffn=48, no_hf_reason="moe_shared_expert_gate",
         **MOE),
    # Mixtral-style with a softmax over all experts before the top k: Mixtral always renormalises, so no hf/
    dict(name="moe_presoftmax_no_hf", pre_softmax=True, no_hf_reason="moe_router_pre_softmax", **MOE),
    # a sigmoid router (DeepSeek-V3-style scores), Qwen3-MoE-style otherwise: no hf/
    dict(name="moe_sigmoid_router_no_hf", qk_norm=True, router_score="sigmoid", no_hf_reason="sigmoid", **MOE),
    dict(name="moe_expert_bias_ep2_tp2", tp=2, ep=2, qk_norm=True, expert_bias=True, no_hf_reason="expert bias",
         **MOE),
]
