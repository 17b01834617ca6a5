"""``args`` (an ``argparse.Namespace``) as Megatron-LM 0.18.2 saves it: a subset of the real saved args
(mount_tests/fixtures/megatron-real/legacy_tp2_pp2/expected/args.json: the architecture, parallelism,
precision, optimizer and checkpoint fields) with the values of that run, then set per case."""
import argparse
import signal

import torch

from megatron_layout import dims

# values of the real run (megatron-core 0.18.2), in the saved order
REAL = dict(
    account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False,
    accumulate_allreduce_grads_in_fp32=True, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-08,
    add_bias_linear=False, add_position_embedding=True, add_qkv_bias=False,
    apply_query_key_layer_scaling=False, apply_residual_connection_post_layernorm=False,
    attention_dropout=0.0, attention_softmax_in_fp32=False, bf16=True, bias_gelu_fusion=False,
    bias_swiglu_fusion=False, ckpt_format="torch", ckpt_fully_parallel_save=True, clip_grad=1.0,
    consumed_train_samples=6, consumed_valid_samples=0, context_parallel_size=1, data_parallel_size=1,
    ddp_bucket_size=None, decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
    deprecated_use_mcore_models=False, distributed_backend="gloo", encoder_num_layers=4,
    encoder_seq_length=32, exit_signal=signal.SIGTERM, exp_avg_dtype=torch.float32,
    exp_avg_sq_dtype=torch.float32, expert_model_parallel_size=1, expert_tensor_parallel_size=2,
    ffn_hidden_size=224, fp16=False, fp32_residual_connection=False, global_batch_size=2,
    group_query_attention=True, hidden_dropout=0.0, hidden_size=80, hysteresis=2, init_method_std=0.02,
    initial_loss_scale=4294967296, iteration=3, kv_channels=10, layernorm_epsilon=1e-05,
    layernorm_zero_centered_gamma=False, load=None, loss_scale=None, loss_scale_window=1000, lr=0.01,
    lr_decay_iters=10, lr_decay_style="cosine", main_grads_dtype=torch.float32,
    main_params_dtype=torch.float32, make_vocab_size_divisible_by=128, max_position_embeddings=32,
    micro_batch_size=1, min_loss_scale=1.0, min_lr=0.001, moe_layer_freq=1, moe_router_topk=2,
    mtp_num_layers=None, no_persist_layer_norm=True, no_save_optim=None, no_save_rng=None,
    normalization="RMSNorm", num_attention_heads=8, num_experts=None,
    num_floating_point_operations_so_far=0, num_layers=4, num_layers_per_virtual_pipeline_stage=None,
    num_query_groups=2, num_virtual_stages_per_pipeline_rank=None, openai_gelu=False, optimizer="adam",
    overlap_grad_reduce=False, overlap_param_gather=False, padded_vocab_size=256, params_dtype=torch.bfloat16,
    pipeline_model_parallel_layout=None, pipeline_model_parallel_size=2, position_embedding_type="rope",
    qk_layernorm=False, rank=0, rope_scaling_factor=8.0, rotary_base=10000, rotary_interleaved=False,
    rotary_percent=1.0, save="legacy_tp2_pp2/checkpoint", save_interval=1000, seed=1234, seq_length=32,
    sequence_parallel=False, spec=None, squared_relu=False, swiglu=True, tensor_model_parallel_size=2,
    tokenizer_model=None, tokenizer_type="NullTokenizer", train_iters=10,
    transformer_impl="local", transformer_pipeline_model_parallel_size=2,
    untie_embeddings_and_output_weights=True, use_cpu_initialization=True, use_dist_ckpt=False,
    use_distributed_optimizer=False, use_rope_scaling=False, use_rotary_position_embeddings=False,
    virtual_pipeline_model_parallel_size=None, vocab_extra_ids=0, vocab_file=None, vocab_size=250,
    weight_decay=0.01, world_size=4,
)

DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_args(case, iteration):
    d = dims(case)
    tp, pp, vp, dp = case["tp"], case["pp"], case["vp"], case["dp"]
    a = dict(REAL)
    a.update(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        transformer_pipeline_model_parallel_size=pp, expert_tensor_parallel_size=tp,
        data_parallel_size=dp, world_size=tp * pp * dp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        num_layers_per_virtual_pipeline_stage=case["layers"] // (pp * vp) if vp > 1 else None,
        decoder_first_pipeline_num_layers=case["first_stage"],
        num_layers=case["layers"], encoder_num_layers=case["layers"], hidden_size=d["H"],
        ffn_hidden_size=d["F"], num_attention_heads=d["np"], kv_channels=d["hn"],
        group_query_attention=case["groups"] is not None, num_query_groups=case["groups"] or 1,
        max_position_embeddings=case["max_pos"], seq_length=32, encoder_seq_length=32,
        position_embedding_type=case["pos"], swiglu=case["swiglu"], normalization=case["norm"],
        add_bias_linear=case["bias"], add_qkv_bias=case["qkv_bias"],
        untie_embeddings_and_output_weights=not case["tied"], rotary_base=case["rotary_base"],
        vocab_size=d["V"], padded_vocab_size=d["Vp"],
        bf16=case["dtype"] == "bf16", fp16=case["dtype"] == "fp16", params_dtype=DTYPE[case["dtype"]],
        transformer_impl="transformer_engine" if case["spec"] == "te" else "local",
        bias_gelu_fusion=case["act"] == "fused_gelu", openai_gelu=case["act"] == "openai_gelu",
        squared_relu=case["act"] == "squared_relu",
        use_distributed_optimizer=case["dist_opt"],
        overlap_grad_reduce=case["overlap_grad_reduce"], ddp_bucket_size=case["ddp_bucket_size"],
        iteration=0 if iteration == "release" else iteration,
        save=f"/checkpoints/{case['name']}", no_save_optim=None if case["optimizer"] else True,
        no_save_rng=None if case["optimizer"] else True, qk_layernorm=case["qk_norm"],
    )
    if case["experts"]:
        a.update(num_experts=case["experts"], expert_model_parallel_size=case["ep"], moe_ffn_hidden_size=case["moe_ffn"],
                 moe_router_topk=case["topk"], moe_grouped_gemm=case["grouped_gemm"], moe_layer_freq=case["moe_freq"],
                 moe_router_pre_softmax=case["pre_softmax"], moe_router_enable_expert_bias=case["expert_bias"],
                 moe_shared_expert_intermediate_size=case["shared_ffn"] or None,
                 moe_router_score_function=case["router_score"],
                 moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01, moe_token_dispatcher_type="alltoall")
    if case["shared_gate"]:
        a["moe_shared_expert_gate"] = True
    if case["naming"] == "legacy":
        a["use_legacy_models"] = True
    if case["dtype"] == "fp16":
        a["loss_scale"] = None
        a["initial_loss_scale"] = 65536
    ns = argparse.Namespace()
    for k in sorted(a):
        setattr(ns, k, a[k])
    return ns
