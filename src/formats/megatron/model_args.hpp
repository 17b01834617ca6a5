// The saved `args` (an argparse.Namespace in every Megatron-LM rank file and common.pt): the only record
// of the parallel sizes and the model's shapes that the merge rules need (docs/formats/megatron.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::megatron {

struct ModelArgs {
  int tp = 1, pp = 1, ep = 1;  // tensor, pipeline, expert parallel sizes
  int dp = 1;
  int64_t num_layers = 0, hidden = 0, ffn_hidden = 0, heads = 0, query_groups = 0, kv_channels = 0;
  int64_t padded_vocab = 0;
  std::optional<int64_t> vocab;  // the tokenizer's true vocabulary, when args records it
  int64_t max_positions = 0;
  int64_t num_experts = 0;
  int etp = 1;                    // expert tensor parallel size
  bool moe_grouped_gemm = false;  // experts as TEGroupedMLP (linear_fc1.weight{e}), else SequentialMLP
  int64_t moe_ffn_hidden = 0;     // an expert's ffn size (moe_ffn_hidden_size, else ffn_hidden_size)
  int64_t moe_topk = 2;
  bool moe_every_layer = true;  // moe_layer_freq 1: no dense MLP layers between the MoE ones
  // Which layers are MoE layers (1) and which dense (0), moe_layer_freq as Megatron expands it; empty when
  // the config gave no pattern this reader knows (then moe_every_layer says all there is)
  std::vector<int> moe_layer_pattern;
  bool moe_pre_softmax = false;  // softmax over all experts before top-k (else over the chosen k)
  bool moe_softmax = true;       // moe_router_score_function softmax (else sigmoid)
  bool moe_expert_bias = false;  // moe_router_enable_expert_bias
  int64_t moe_shared_ffn = 0;    // shared experts' size (moe_shared_expert_intermediate_size), 0: none
  // moe_shared_expert_gate (a TransformerConfig field: Bridge's configs carry it, Megatron-LM's command line
  // has no flag for it): the shared experts' output scaled by sigmoid(x . shared_experts.gate_weight)
  bool moe_shared_gate = false;
  double moe_aux_loss_coeff = 0;
  bool qk_layernorm = false;  // per-head RMSNorm of q and k (Qwen3)
  bool swiglu = false;
  bool squared_relu = false;
  bool post_layernorm_residual = false;  // apply_residual_connection_post_layernorm
  bool tied_embeddings = true;           // not untie_embeddings_and_output_weights
  bool add_bias_linear = true, add_qkv_bias = false;
  bool distributed_optimizer = false;
  std::optional<int64_t> ddp_bucket_size;  // elements per gradient bucket, when overlap_grad_reduce was on
  bool local_spec = false;         // transformer_impl == "local": separate norm modules, not TE's fused ones
  bool layernorm_1p = false;       // stored norm weights are centred on 0 (apply_layernorm_1p)
  std::string position_embedding;  // "rope", "learned_absolute", ...
  std::string normalization;       // "RMSNorm", "LayerNorm"
  double norm_epsilon = 1e-5, rotary_base = 10000, init_std = 0.02;
  bool rotary_interleaved = false;
  double rotary_percent = 1.0;
  std::optional<double> rope_scaling_factor;  // Llama 3.1-style rope scaling (use_rope_scaling)
  bool tanh_gelu = false;  // GeLU computed with the tanh approximation (fused bias-GeLU, openai_gelu)
  DType params_dtype = DType::F32;  // the training dtype: bf16, fp16 or fp32
};

// Megatron's moe_layer_freq expanded over `num_layers` layers (gpt_layer_specs.py): an int n makes layer i an
// MoE layer when i % n == 0; a list gives each layer's 1 (MoE) or 0 (dense). Empty when the int is not
// positive or the list is not num_layers 0s and 1s (the caller names the field).
std::vector<int> moe_layer_pattern(const std::variant<int64_t, std::vector<int64_t>>& freq,
                                   int64_t num_layers);

// Reads `args` (the Namespace field of a rank file). Throws FormatError naming the file and the field
// when a size the merge needs is missing or not an int.
ModelArgs read_model_args(const formats::Field& args);

}  // namespace ckptfs::megatron
