#include "formats/megatron/model_args.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ckptfs::megatron {

namespace {

using formats::Field;
using pickle::Kind;

bool flag(const Field& args, std::string_view key, bool fallback) {
  const Field f = args[key];
  if (!f.present()) return fallback;
  const auto& v = f.value();
  if (v.is(Kind::Bool)) return v.boolean;
  if (v.is(Kind::Int)) return v.integer != 0;
  f.fail("expected a bool");
}

double number(const Field& args, std::string_view key, double fallback) {
  const Field f = args[key];
  if (!f.present()) return fallback;
  const auto& v = f.value();
  if (v.is(Kind::Float)) return v.real;
  if (v.is(Kind::Int)) return static_cast<double>(v.integer);
  f.fail("expected a number");
}

int64_t integer(const Field& args, std::string_view key, int64_t fallback) {
  const Field f = args[key];
  return f.present() ? f.as_int() : fallback;
}

int64_t required(const Field& args, std::string_view key) {
  const Field f = args[key];
  if (!f.present()) f.fail("missing: the saved args do not give this size");
  return f.as_int();
}

std::string text(const Field& args, std::string_view key, std::string fallback) {
  const Field f = args[key];
  return f.present() && f.value().is(Kind::String) ? f.value().text : fallback;
}

}  // namespace

std::vector<int> moe_layer_pattern(const std::variant<int64_t, std::vector<int64_t>>& freq,
                                   int64_t num_layers) {
  std::vector<int> out;
  if (const auto* every = std::get_if<int64_t>(&freq)) {
    if (*every <= 0) return {};
    for (int64_t l = 0; l < num_layers; ++l) out.push_back(l % *every == 0 ? 1 : 0);
    return out;
  }
  const auto& list = std::get<std::vector<int64_t>>(freq);
  if (static_cast<int64_t>(list.size()) != num_layers) return {};
  for (const int64_t x : list) {
    if (x != 0 && x != 1) return {};
    out.push_back(static_cast<int>(x));
  }
  return out;
}

ModelArgs read_model_args(const Field& args) {
  if (!args.present()) args.fail("missing: a Megatron-LM checkpoint saves its args here");
  ModelArgs a;
  a.tp =
      static_cast<int>(integer(args, "tensor_model_parallel_size", integer(args, "model_parallel_size", 1)));
  a.pp = static_cast<int>(integer(args, "pipeline_model_parallel_size", 1));
  a.ep = static_cast<int>(integer(args, "expert_model_parallel_size", 1));
  a.dp = static_cast<int>(integer(args, "data_parallel_size", 1));
  if (a.tp < 1 || a.pp < 1 || a.ep < 1)
    args.fail(fmt::format("parallel sizes TP {} PP {} EP {}", a.tp, a.pp, a.ep));
  a.num_layers = required(args, "num_layers");
  a.hidden = required(args, "hidden_size");
  a.heads = required(args, "num_attention_heads");
  a.ffn_hidden = integer(args, "ffn_hidden_size", 4 * a.hidden);
  a.query_groups = flag(args, "group_query_attention", false) ? required(args, "num_query_groups") : a.heads;
  a.kv_channels = integer(args, "kv_channels", a.heads > 0 ? a.hidden / a.heads : 0);
  a.padded_vocab = required(args, "padded_vocab_size");
  if (const Field v = args["vocab_size"]; v.present()) a.vocab = v.as_int();
  a.max_positions = integer(args, "max_position_embeddings", integer(args, "seq_length", 0));
  a.num_experts = integer(args, "num_experts", 0);
  a.etp = static_cast<int>(integer(args, "expert_tensor_parallel_size", a.tp));
  a.moe_grouped_gemm = flag(args, "moe_grouped_gemm", false);
  a.moe_ffn_hidden = integer(args, "moe_ffn_hidden_size", a.ffn_hidden);
  a.moe_topk = integer(args, "moe_router_topk", 2);
  if (const Field f = args["moe_layer_freq"]; f.present() && a.num_experts > 0) {
    const auto refuse = [&] {
      f.fail(fmt::format("expected a positive int or a list of {} 0s and 1s (one per layer)", a.num_layers));
    };
    if (f.value().is(Kind::Int))
      a.moe_layer_pattern = moe_layer_pattern(f.as_int(), a.num_layers);
    else if (f.is_list()) {
      std::vector<int64_t> list;
      for (size_t i = 0; i < f.size(); ++i) {
        if (!f.at(i).value().is(Kind::Int)) refuse();
        list.push_back(f.at(i).as_int());
      }
      a.moe_layer_pattern = moe_layer_pattern(list, a.num_layers);
    }
    if (a.moe_layer_pattern.empty())
      refuse();  // also a string: Megatron evaluates it as Python, ckptfs does not
    a.moe_every_layer = std::ranges::count(a.moe_layer_pattern, 0) == 0;
  }
  a.moe_pre_softmax = flag(args, "moe_router_pre_softmax", false);
  a.moe_softmax = text(args, "moe_router_score_function", "softmax") == "softmax";
  a.moe_expert_bias = flag(args, "moe_router_enable_expert_bias", false);
  a.moe_shared_ffn = integer(args, "moe_shared_expert_intermediate_size", 0);
  a.moe_shared_gate = flag(args, "moe_shared_expert_gate", false);
  a.moe_aux_loss_coeff = number(args, "moe_aux_loss_coeff", 0.0);
  a.qk_layernorm = flag(args, "qk_layernorm", false);
  a.swiglu = flag(args, "swiglu", false);
  a.squared_relu = flag(args, "squared_relu", false);
  a.post_layernorm_residual = flag(args, "apply_residual_connection_post_layernorm", false);
  a.tied_embeddings = !flag(args, "untie_embeddings_and_output_weights", false);
  a.add_bias_linear = flag(args, "add_bias_linear", true);
  a.add_qkv_bias = flag(args, "add_qkv_bias", false);
  a.distributed_optimizer = flag(args, "use_distributed_optimizer", false);
  // DDP's default bucket: max(40M, 1M x DP) elements (--ddp-bucket-size overrides it).
  if (flag(args, "overlap_grad_reduce", false))
    a.ddp_bucket_size =
        integer(args, "ddp_bucket_size", std::max<int64_t>(40'000'000, 1'000'000 * int64_t{a.dp}));
  a.local_spec = text(args, "transformer_impl", "transformer_engine") == "local";
  a.layernorm_1p =
      flag(args, "apply_layernorm_1p", false) || flag(args, "layernorm_zero_centered_gamma", false);
  a.position_embedding = text(args, "position_embedding_type", "learned_absolute");
  a.normalization = text(args, "normalization", "LayerNorm");
  // core <= 0.15 saves norm_epsilon, later versions layernorm_epsilon
  a.norm_epsilon = number(args, "layernorm_epsilon", number(args, "norm_epsilon", 1e-5));
  a.rotary_base = number(args, "rotary_base", 10000);
  a.rotary_interleaved = flag(args, "rotary_interleaved", false);
  a.rotary_percent = number(args, "rotary_percent", 1.0);
  if (flag(args, "use_rope_scaling", false)) a.rope_scaling_factor = number(args, "rope_scaling_factor", 8.0);
  // Megatron's fused bias-GeLU (on by default, used where linears have biases) is the tanh approximation.
  a.tanh_gelu = flag(args, "openai_gelu", false) || (flag(args, "bias_gelu_fusion", true) &&
                                                     a.add_bias_linear && !flag(args, "onnx_safe", false));
  a.init_std = number(args, "init_method_std", 0.02);
  a.params_dtype = flag(args, "bf16", false)   ? DType::BF16
                   : flag(args, "fp16", false) ? DType::F16
                                               : DType::F32;
  return a;
}

}  // namespace ckptfs::megatron
