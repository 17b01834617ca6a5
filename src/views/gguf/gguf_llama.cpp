#include "views/gguf/gguf_llama.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numbers>
#include <optional>
#include <regex>

#include "views/gguf/converted_tensor.hpp"
#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

uint64_t size_field(const json& config, const char* key, std::optional<uint64_t> fallback = std::nullopt) {
  const json v = config.value(key, json());
  if (v.is_null() && fallback) return *fallback;
  if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 || v.get<uint64_t>() > (uint64_t{1} << 24))
    throw Refusal(fmt::format("config.json: {} missing or not a size", key));
  return v.get<uint64_t>();
}

double number_field(const json& object, const char* key, double fallback) {
  const json v = object.value(key, json());
  if (v.is_null()) return fallback;
  if (!v.is_number()) throw Refusal(fmt::format("config.json: {} is not a number", key));
  return v.get<double>();
}

bool llama_class(Family f) {
  return f == Family::llama || f == Family::mixtral;
}

// The Hugging Face name's GGUF name (gguf-py's TensorNameMap, with the tensors the family's architecture
// has); empty when unmappable.
std::string llama_name(const std::string& hf, Family family) {
  static const std::vector<std::pair<std::string, std::string>> kFixed = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"lm_head.weight", "output.weight"},
      {"model.norm.weight", "output_norm.weight"}};
  for (const auto& [from, to] : kFixed)
    if (hf == from) return to;
  const bool qwen3 = family == Family::qwen3 || family == Family::qwen3_moe;
  const bool dense = family != Family::qwen3_moe;  // qwen3moe has no ffn_gate/up/down
  const bool router = family == Family::qwen3_moe || llama_class(family);
  struct InLayer {
    std::string_view from, to;
    bool in_family;
  };
  const std::vector<InLayer> in_layer = {{"input_layernorm.weight", "attn_norm.weight", true},
                                         {"post_attention_layernorm.weight", "ffn_norm.weight", true},
                                         {"self_attn.q_proj.weight", "attn_q.weight", true},
                                         {"self_attn.q_proj.bias", "attn_q.bias", true},
                                         {"self_attn.k_proj.weight", "attn_k.weight", true},
                                         {"self_attn.k_proj.bias", "attn_k.bias", true},
                                         {"self_attn.v_proj.weight", "attn_v.weight", true},
                                         {"self_attn.v_proj.bias", "attn_v.bias", true},
                                         {"self_attn.o_proj.weight", "attn_output.weight", true},
                                         {"self_attn.q_norm.weight", "attn_q_norm.weight", qwen3},
                                         {"self_attn.k_norm.weight", "attn_k_norm.weight", qwen3},
                                         {"mlp.gate_proj.weight", "ffn_gate.weight", dense},
                                         {"mlp.up_proj.weight", "ffn_up.weight", dense},
                                         {"mlp.down_proj.weight", "ffn_down.weight", dense},
                                         {"mlp.gate.weight", "ffn_gate_inp.weight", router},
                                         {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight", router}};
  static const std::regex kLayer(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(hf, m, kLayer)) return "";
  for (const auto& [from, to, in_family] : in_layer)
    if (in_family && m[2].str() == from) return fmt::format("blk.{}.{}", m[1].str(), to);
  return "";
}

// How the family's converter class stacks a MoE layer's experts (qwen.py's Qwen2MoeModel, llama.py's
// LlamaModel): which names it collects, and the projections it stacks, in the order it writes them.
struct ExpertStacking {
  std::string_view collects;  // a name holding this is an expert's
  std::string_view block;     // model.layers.{l}.{block}{e}.{projection}.weight
  std::array<std::pair<std::string_view, std::string_view>, 3> projections;  // HF name, GGUF name
};
constexpr ExpertStacking kQwenExperts{
    "experts",
    "mlp.experts.",
    {{{"down_proj", "ffn_down_exps"}, {"gate_proj", "ffn_gate_exps"}, {"up_proj", "ffn_up_exps"}}}};
constexpr ExpertStacking kMixtralExperts{
    "block_sparse_moe.experts",
    "block_sparse_moe.experts.",
    {{{"w1", "ffn_gate_exps"}, {"w2", "ffn_down_exps"}, {"w3", "ffn_up_exps"}}}};

// The converter's block id: the name's first all-digit dot-separated part.
std::optional<uint64_t> block_id(std::string_view name) {
  for (size_t start = 0; start <= name.size();) {
    const size_t end = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, end - start);
    if (!part.empty() &&
        std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return part.size() <= 9 ? std::optional<uint64_t>(std::stoull(std::string(part))) : std::nullopt;
    start = end + 1;
  }
  return std::nullopt;
}

// Collects each layer's expert tensors as the converter does, stacking them once it holds 3 per expert.
class ExpertCollector {
 public:
  ExpertCollector(const ExpertStacking& stacking, const LlamaConfig& c) : stacking_(stacking), c_(c) {}

  bool collects(std::string_view name) const {
    return name.find(stacking_.collects) != std::string_view::npos;
  }

  // Takes the expert tensor `i` of `hf`; the stacked tensors when it completes its layer.
  std::vector<GgufTensor> take(const std::shared_ptr<const catalog::Catalog>& hf, size_t i, GgmlType type) {
    const std::string& name = hf->tensors[i].name;
    const auto bid = block_id(name);
    if (!bid || *bid >= c_.layers)
      throw Refusal(fmt::format("tensor {}: an expert outside the model's {} layers", name, c_.layers));
    auto& layer = layers_[*bid];
    layer[name] = i;
    std::vector<GgufTensor> out;
    if (layer.size() < c_.experts * 3) return out;
    for (const auto& [projection, gguf_name] : stacking_.projections) {
      std::vector<catalog::TensorRef> experts;
      for (uint64_t e = 0; e < c_.experts; ++e) {
        const std::string expected =
            fmt::format("model.layers.{}.{}{}.{}.weight", *bid, stacking_.block, e, projection);
        const auto it = layer.find(expected);
        if (it == layer.end())
          throw Refusal(fmt::format("layer {}: no tensor {} (the converter fails to stack its experts)", *bid,
                                    expected));
        experts.push_back({hf, it->second});
        layer.erase(it);
      }
      out.push_back(
          stacked_experts(fmt::format("blk.{}.{}.weight", *bid, gguf_name), std::move(experts), type));
    }
    return out;
  }

  // The converter fails on expert tensors it never stacked.
  void check_all_stacked() const {
    for (const auto& [bid, layer] : layers_)
      if (!layer.empty())
        throw Refusal(
            fmt::format("tensor {}: an expert the converter does not stack (Unprocessed experts: "
                        "{} experts a layer)",
                        layer.begin()->first, c_.experts));
  }

 private:
  const ExpertStacking& stacking_;
  const LlamaConfig& c_;
  std::map<uint64_t, std::map<std::string, size_t>> layers_;  // block id -> expert name -> tensor index
};

// conversion/llama.py's generate_extra_tensors for rope_type llama3, in float32 as torch computes it
// (torch's scalar ** tensor is glibc's powf at ATen's default CPU capability).
std::vector<float> llama3_rope_factors(const LlamaConfig& c) {
  const auto dim = static_cast<float>(c.head_dim);
  const float low_wavelen = static_cast<float>(c.original_context / c.low_freq_factor);
  const float high_wavelen = static_cast<float>(c.original_context / c.high_freq_factor);
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  std::vector<float> factors;
  for (uint64_t i = 0; i < c.head_dim; i += 2) {
    const float freq = 1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(i) / dim);
    const float wavelen = two_pi * (1.0f / freq);
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(static_cast<float>(c.rope_factor));
    } else {
      const float smooth = (static_cast<float>(c.original_context) * (1.0f / wavelen) -
                            static_cast<float>(c.low_freq_factor)) /
                           static_cast<float>(c.high_freq_factor - c.low_freq_factor);
      factors.push_back(1.0f / ((1.0f - smooth) / static_cast<float>(c.rope_factor) + smooth));
    }
  }
  return factors;
}

}  // namespace

std::string_view architecture_name(Family family) {
  switch (family) {
    case Family::llama:
    case Family::mixtral:
      return "llama";
    case Family::qwen2:
      return "qwen2";
    case Family::qwen3:
      return "qwen3";
    case Family::qwen3_moe:
      return "qwen3moe";
  }
  throw std::logic_error("unknown family");
}

LlamaConfig read_llama_config(const json& config, Family family) {
  LlamaConfig c;
  c.family = family;
  const bool llama = family == Family::llama, mixtral = family == Family::mixtral;
  const bool moe = mixtral || family == Family::qwen3_moe;
  c.layers = size_field(config, "num_hidden_layers");
  c.hidden = size_field(config, "hidden_size");
  // Qwen3MoeConfig's default where absent (the dense layers' size, which the converter writes all the same)
  c.intermediate = size_field(config, "intermediate_size",
                              family == Family::qwen3_moe ? std::optional<uint64_t>(6144) : std::nullopt);
  c.heads = size_field(config, "num_attention_heads");
  // the other config classes' own defaults for these differ from the model's sizes: required
  c.kv_heads =
      llama ? size_field(config, "num_key_value_heads", c.heads) : size_field(config, "num_key_value_heads");
  c.context = size_field(config, "max_position_embeddings", llama ? 2048 : mixtral ? 131072 : 32768);
  // LlamaConfig derives head_dim, Qwen3Config defaults it to 128; Qwen2, Qwen3-MoE and Mixtral have it only
  // as config.json gives it (Mixtral's null: none)
  const bool has_head_dim = config.contains("head_dim") && !config["head_dim"].is_null();
  c.head_dim_key = llama || family == Family::qwen3 || has_head_dim;
  c.head_dim = size_field(config, "head_dim", family == Family::qwen3 ? 128 : c.hidden / c.heads);
  c.vocab_size =
      llama_class(family) ? size_field(config, "vocab_size", 32000) : size_field(config, "vocab_size");
  if ((family == Family::qwen2 || family == Family::qwen3) &&
      (config.contains("classifier_pooling") || config.contains("classifier_activation")))
    throw Refusal("config.json: classifier keys not followed by ckptfs yet");
  c.rms_norm_eps = number_field(config, "rms_norm_eps", mixtral ? 1e-5 : 1e-6);
  if (llama_class(family) && (c.vocab_size == 32016 || c.vocab_size == 49152))
    throw Refusal(
        "config.json: a CodeLlama or Granite vocabulary size (the converter adds tokens ckptfs does not)");
  if (config.value("is_causal", json()) == json(false)) throw Refusal("config.json: is_causal false");
  if (config.contains("quantization_config")) throw Refusal("config.json: a quantized model");
  if (c.head_dim % 2 != 0 || c.heads % c.kv_heads != 0)
    throw Refusal("config.json: head sizes the converter cannot permute");
  // keys the converter writes as expert groups or a gating function (conversion/base.py)
  for (const char* key : {"n_routed_experts", "num_experts_per_token", "top_k_experts", "n_group",
                          "topk_group", "score_function", "scoring_func", "score_func",
                          "moe_router_activation", "moe_router_activation_func", "expert_selection_fn",
                          "router_score_func", "prefix_dense_intermediate_size", "dense_intermediate_size"})
    if (config.contains(key)) throw Refusal(fmt::format("config.json: {} not followed by ckptfs yet", key));
  if (moe) {
    // Qwen3MoeConfig reads num_experts as num_local_experts
    c.experts =
        size_field(config, config.contains("num_local_experts") ? "num_local_experts" : "num_experts");
    c.experts_used = size_field(config, "num_experts_per_tok");
    if (family == Family::qwen3_moe) c.expert_intermediate = size_field(config, "moe_intermediate_size", 768);
  } else if (config.contains("num_local_experts") || config.contains("num_experts") ||
             config.contains("num_experts_per_tok")) {
    throw Refusal("config.json: expert counts for a dense architecture not followed by ckptfs yet");
  }
  // transformers 5 reads rope_parameters, or rope_scaling with a top-level rope_theta
  json rope = config.value("rope_parameters", json());
  if (!rope.is_object()) rope = config.value("rope_scaling", json());
  if (!rope.is_object()) rope = json::object();
  c.rope_theta =
      number_field(rope, "rope_theta", number_field(config, "rope_theta", mixtral ? 1000000.0 : 10000.0));
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "llama3" && llama_class(family)) {
    c.llama3_rope = true;
    c.rope_factor = number_field(rope, "factor", 8.0);
    c.low_freq_factor = number_field(rope, "low_freq_factor", 1.0);
    c.high_freq_factor = number_field(rope, "high_freq_factor", 4.0);
    c.original_context = number_field(rope, "original_max_position_embeddings", 8192);
  } else if (type != "default") {
    throw Refusal(fmt::format("config.json: rope_type {} not followed by ckptfs yet", type));
  }
  return c;
}

void add_llama_parameters(KvList& kv, const LlamaConfig& c, uint32_t file_type) {
  const std::string_view arch = architecture_name(c.family);
  const auto u32 = [&](std::string_view key, uint64_t v) {
    kv.add_u32(fmt::format("{}.{}", arch, key), static_cast<uint32_t>(v));
  };
  // conversion/base.py's TextModel.set_gguf_parameters
  u32("block_count", c.layers);
  u32("context_length", c.context);
  u32("embedding_length", c.hidden);
  u32("feed_forward_length", c.intermediate);
  u32("attention.head_count", c.heads);
  u32("attention.head_count_kv", c.kv_heads);
  kv.add_f32(fmt::format("{}.rope.freq_base", arch), c.rope_theta);
  kv.add_f32(fmt::format("{}.attention.layer_norm_rms_epsilon", arch), c.rms_norm_eps);
  if (c.experts > 0) {
    u32("expert_count", c.experts);
    u32("expert_used_count", c.experts_used);
  }
  if (c.head_dim_key) {
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
  }
  kv.add_u32("general.file_type", file_type);
  if (llama_class(c.family)) {  // conversion/llama.py's own
    u32("vocab_size", c.vocab_size);
    u32("rope.dimension_count", c.head_dim);
  }
  if (c.family == Family::qwen3_moe) u32("expert_feed_forward_length", c.expert_intermediate);  // qwen.py's
}

std::vector<GgufTensor> llama_tensors(const std::shared_ptr<const catalog::Catalog>& hf,
                                      std::span<const size_t> order, const LlamaConfig& c, GgmlType type) {
  std::vector<GgufTensor> out;
  if (c.llama3_rope) {
    auto factors = llama3_rope_factors(c);
    out.push_back({"rope_freqs.weight", {factors.size()}, GgmlType::f32, ComputedF32{std::move(factors)}});
  }
  std::optional<ExpertCollector> experts;
  if (c.family == Family::mixtral) experts.emplace(kMixtralExperts, c);
  if (c.family == Family::qwen3_moe) experts.emplace(kQwenExperts, c);
  for (size_t i : order) {
    const auto& t = hf->tensors[i];
    if (t.name.ends_with(".rotary_emb.inv_freq")) continue;  // skipped by the converter
    if (experts && experts->collects(t.name)) {
      if (t.name.ends_with("experts.gate_up_proj") || t.name.ends_with("experts.down_proj") ||
          t.name.ends_with("experts.gate_up_proj.weight") || t.name.ends_with("experts.down_proj.weight"))
        throw Refusal(fmt::format("tensor {}: fused experts not followed by ckptfs yet", t.name));
      for (auto& g : experts->take(hf, i, type)) out.push_back(std::move(g));
      continue;
    }
    const std::string name = llama_name(t.name, c.family);
    if (name.empty()) throw Refusal(fmt::format("the converter cannot map tensor {}", t.name));
    GgufTensor g = converted_tensor(name, {hf, i}, type);
    const bool q = t.name.ends_with("q_proj.weight") || t.name.ends_with("q_proj.bias");
    const bool k = t.name.ends_with("k_proj.weight") || t.name.ends_with("k_proj.bias");
    if ((q || k) && llama_class(c.family)) {
      const uint64_t heads = q ? c.heads : c.kv_heads;
      if (static_cast<uint64_t>(t.shape[0]) % (2 * heads) != 0)
        throw Refusal(
            fmt::format("tensor {}: {} rows cannot be permuted over {} heads", t.name, t.shape[0], heads));
      std::get<SourceRows>(g.elements).permute_heads = heads;
    }
    out.push_back(std::move(g));
  }
  if (experts) experts->check_all_stacked();
  return out;
}

}  // namespace ckptfs::views::gguf
