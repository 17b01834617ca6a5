"""The generated per-rank FSDP cases (mount_tests/gen_fsdp_local/generate_fsdp_local.py), shared by the generator
(in the Debian unstable chroot: torch 2.14, transformers 5.12) and the tests (host).  Standard library only.

A case: how it is saved ("kind"), the model ("arch" and its sizes), the world size, the dtype the parameters are
stored in, MixedPrecision's param_dtype ("mp"), use_orig_params ("orig"), the sharding strategy, the wrap policy
("transformer": transformer_auto_wrap_policy on the decoder layer class; "size": size_based_auto_wrap_policy with
"min_params"; "custom": the no-config model's own), the rank file names ("naming"), whether config.json is written
beside them ("config"; without it the expectation is the units' flat parameters, unless "names_from_optimizer":
the names and shapes in the optimizer's DCP metadata), and "features": what the live FlatParameters must show (the generator checks each one):
  align_pad    alignment padding between two parameters of a unit (use_orig_params: 16 bytes of the compute dtype)
  ws_pad       use_orig_params: padding at the end of a unit so that it divides by the world size
  tail_pad     use_orig_params=False: the last rank's shard is shorter (its padding is not saved)
  empty_rank   a rank holds no element of some unit (its ShardedTensor has no local shard)
  empty_piece  use_orig_params: some rank holds none of some parameter (its 1-D piece is empty)

kind: "fsdp1" (LOCAL_STATE_DICT, torch.save per rank), "accelerate" (Accelerator.save_state's files),
"trainer" (HF Trainer's output dir: checkpoint-N per step in "steps"), "fsdp2" (fully_shard, torch.save of the
DTensor state dict per rank).
"""
GEN_VERSION = 1

# The sizes: odd on purpose (hidden 42 / 44, intermediate 75: parameters of numels that are not multiples of 4 or
# 8, so use_orig_params pads between them).  head_dim is given (rotary embeddings need it even).
LLAMA = dict(arch="llama", vocab=131, hidden=42, inter=75, layers=2, heads=6, kv=2, head_dim=8)
LLAMA44 = dict(LLAMA, hidden=44, heads=4)  # 44 does not divide by 3: the layer unit (14,212) does not either
QWEN2 = dict(arch="qwen2", vocab=131, hidden=42, inter=75, layers=2, heads=6, kv=2, head_dim=8)  # tied, qkv biases
GPT2 = dict(arch="gpt2", vocab=131, hidden=40, inter=75, layers=2, heads=5, positions=64)  # tied, Conv1D
CUSTOM = dict(arch="custom", vocab=50, hidden=12, inter=20, layers=2)  # no config.json: an unknown architecture

FSDP1 = dict(kind="fsdp1", dtype="float32", mp=None, orig=False, strategy="FULL_SHARD", wrap="transformer",
             naming="rank{r}.pt", config=True, steps=[3])

CASES = {
    # hidden 42, intermediate 75, FULL_SHARD, no alignment: the layer unit (14,910 elements) is 7,455 per rank
    "fsdp1_llama_ws2_fp32_flat": dict(FSDP1, **LLAMA, ws=2, seed=21, features=[]),
    # use_orig_params at W=3: alignment to 4 fp32 elements (75 x 42 = 3,150 elements: 2 of padding after each
    # MLP weight), the layer unit (14,918) padded to a multiple of 3 at the end
    "fsdp1_llama_ws3_fp32_orig": dict(FSDP1, **LLAMA, ws=3, orig=True, seed=22,
                                      features=["align_pad", "ws_pad", "empty_piece"]),
    # the size-based policy: self_attn, mlp, embed_tokens and lm_head wrapped on their own, the decoder layers not
    # (their norms and the final norm are the root unit's); W=4: last ranks' shards shorter
    "fsdp1_llama_ws4_fp32_sizewrap": dict(FSDP1, **LLAMA, ws=4, wrap="size", min_params=3000, seed=23,
                                          features=["tail_pad"]),
    # MixedPrecision(param_dtype=bf16) over fp32 parameters with use_orig_params: the flat parameters stay fp32,
    # aligned to 8 elements (16 bytes of the bf16 compute dtype)
    "fsdp1_llama_ws2_mp_bf16_orig": dict(FSDP1, **LLAMA, ws=2, mp="bfloat16", orig=True, seed=24,
                                         features=["align_pad", "empty_piece"]),
    # a model stored in bf16 (bf16 flat parameters), SHARD_GRAD_OP, W=3
    "fsdp1_llama_ws3_bf16_flat": dict(FSDP1, **LLAMA44, ws=3, dtype="bfloat16", strategy="SHARD_GRAD_OP",
                                      seed=25, features=["tail_pad"]),
    # Qwen2, tied embeddings (one parameter, two names), q/k/v biases; use_orig_params, SHARD_GRAD_OP, W=4
    "fsdp1_qwen2_ws4_fp32_tied_orig": dict(FSDP1, **QWEN2, ws=4, orig=True, strategy="SHARD_GRAD_OP", seed=26,
                                           features=["align_pad", "ws_pad", "empty_piece"]),
    # Qwen2 tied with MixedPrecision bf16 and flat parameters (no alignment), the size-based policy at 5,000 below the
    # decoder layers: each self_attn (5,456) and mlp (9,450) is a unit, the layers' norms, embed_tokens and lm_head
    # (vocab 101: 4,242 each, one parameter) stay in the root.  (A threshold that puts embed_tokens and lm_head in
    # different units unties them: FSDP1 flattens the one parameter into both, they train apart, and FULL_STATE_DICT
    # gives two different tensors.)
    "fsdp1_qwen2_ws2_mp_bf16_sizewrap": dict(FSDP1, **dict(QWEN2, vocab=101), ws=2, mp="bfloat16", wrap="size",
                                             min_params=5000,
                                             seed=27, features=[]),
    # GPT-2 (Conv1D weights, biases, tied lm_head), flat parameters, W=3
    "fsdp1_gpt2_ws3_fp32_tied_flat": dict(FSDP1, **GPT2, ws=3, seed=28, features=["tail_pad"]),
    # GPT-2 stored in bf16 with use_orig_params: alignment to 8 bf16 elements
    "fsdp1_gpt2_ws2_bf16_orig": dict(FSDP1, **GPT2, ws=2, dtype="bfloat16", orig=True, seed=29,
                                     features=["align_pad", "empty_piece"]),
    # accelerate 1.14 Accelerator.save_state with FullyShardedDataParallelPlugin(fsdp_version=1,
    # state_dict_type="LOCAL_STATE_DICT", use_orig_params=True, auto_wrap_policy="transformer_based_wrap")
    "accelerate_qwen2_ws3_fp32_orig": dict(FSDP1, **QWEN2, kind="accelerate", ws=3, orig=True,
                                           naming="pytorch_model_fsdp_rank{r}.bin", seed=31,
                                           features=["align_pad", "ws_pad", "empty_piece"]),
    # accelerate with two models (and two optimizers): pytorch_model_fsdp_rank{R}.bin (a Llama, config.json's)
    # and pytorch_model_fsdp_1_rank{R}.bin (a GPT-2), optimizer_0/ and optimizer_1/
    "accelerate_two_models_ws2": dict(FSDP1, **LLAMA, kind="accelerate", ws=2, orig=False,
                                      naming="pytorch_model_fsdp_rank{r}.bin", second=dict(GPT2), seed=32,
                                      features=[]),
    # accelerate's folder without config.json: the optimizer's DCP metadata (optimizer_0/.metadata) lists every
    # parameter's name and full shape (untied Llama: the golden's names exactly), flat parameters at W=3
    "accelerate_llama_ws3_fp32_noconfig": dict(FSDP1, **LLAMA44, kind="accelerate", ws=3, config=False,
                                               names_from_optimizer=True, naming="pytorch_model_fsdp_rank{r}.bin",
                                               seed=34, features=["tail_pad"]),
    # HF Trainer's output dir: checkpoint-2/ and checkpoint-4/ (save_steps 2), Trainer's own file names
    "trainer_llama_ws2_fp32_orig": dict(FSDP1, **LLAMA, kind="trainer", ws=2, orig=True,
                                        naming="pytorch_model_fsdp_rank{r}.bin", steps=[2, 4], seed=33,
                                        features=["align_pad", "empty_piece"]),
    # the bundled gguf/ example (examples/fsdp-llama-gguf): a bf16 Llama with GPT-2's 50,257-token vocabulary (the
    # smallest real tokenizer), as small as the vocabulary allows: hidden 8, 2 layers
    "fsdp1_llama_ws2_bf16_gguf_example": dict(FSDP1, **dict(LLAMA, vocab=50257, hidden=8, inter=16, heads=2, kv=1,
                                                            head_dim=4), ws=2, dtype="bfloat16", seed=35,
                                              features=[]),
    # FSDP2 fully_shard (each decoder layer, then the root), DTensors per rank under two namings, fp32 kept
    "fsdp2_qwen2_ws3_fp32_rankpt": dict(FSDP1, **QWEN2, kind="fsdp2", ws=3, naming="rank{r}.pt", seed=41,
                                        features=[]),
    "fsdp2_llama_ws4_fp32_worldsize": dict(FSDP1, **LLAMA, kind="fsdp2", ws=4,
                                           naming="model_world_size_{w}_rank_{r}.pt", seed=42, features=[]),
    # no config.json, a model no architecture table knows (with a persistent and a non-persistent buffer); a
    # unit of 9 elements ("gate", Linear(2, 3)) at W=4: 3/3/3/0, rank 3 holds none of it
    "noconfig_custom_ws4_flat": dict(FSDP1, **CUSTOM, ws=4, wrap="custom", config=False, seed=51,
                                     features=["tail_pad", "empty_rank"]),
}

# from_pretrained of the mount (sid chroot): a Llama, a Qwen2 (tied), a GPT-2 (tied), an FSDP2 save
HF_CASES = ["fsdp1_llama_ws3_fp32_orig", "fsdp1_qwen2_ws4_fp32_tied_orig", "fsdp1_gpt2_ws3_fp32_tied_flat",
            "fsdp1_gpt2_ws2_bf16_orig", "fsdp2_qwen2_ws3_fp32_rankpt"]


def rank_file(settings, rank):
    return settings["naming"].format(r=rank, w=settings["ws"])


def tags_of(settings):
    """The tags of a mount of the case's checkpoint/: Trainer's checkpoint-N dirs, else none (one save)."""
    return [f"checkpoint-{s}" for s in settings["steps"]] if settings["kind"] == "trainer" else []
