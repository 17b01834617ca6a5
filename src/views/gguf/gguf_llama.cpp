#include "views/gguf/gguf_llama.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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

// The Hugging Face name's GGUF name (gguf-py's TensorNameMap for the llama architecture); empty when
// unmappable.
std::string llama_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> kFixed = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"lm_head.weight", "output.weight"},
      {"model.norm.weight", "output_norm.weight"}};
  for (const auto& [from, to] : kFixed)
    if (hf == from) return to;
  static const std::regex kLayer(R"(model\.layers\.(\d+)\.(.+))");
  static const std::vector<std::pair<std::string, std::string>> kInLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  std::smatch m;
  if (!std::regex_match(hf, m, kLayer)) return "";
  for (const auto& [from, to] : kInLayer)
    if (m[2] == from) return fmt::format("blk.{}.{}", m[1].str(), to);
  return "";
}

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
  return family == Family::llama ? "llama" : "qwen2";
}

LlamaConfig read_llama_config(const json& config, Family family) {
  LlamaConfig c;
  c.family = family;
  const bool llama = family == Family::llama;
  c.layers = size_field(config, "num_hidden_layers");
  c.hidden = size_field(config, "hidden_size");
  c.intermediate = size_field(config, "intermediate_size");
  c.heads = size_field(config, "num_attention_heads");
  // Qwen2Config's own defaults for these differ from the model's sizes: required
  c.kv_heads =
      llama ? size_field(config, "num_key_value_heads", c.heads) : size_field(config, "num_key_value_heads");
  c.context = size_field(config, "max_position_embeddings", llama ? 2048 : 32768);
  c.head_dim_key = llama || config.contains("head_dim");
  c.head_dim = size_field(config, "head_dim", c.hidden / c.heads);
  c.vocab_size = llama ? size_field(config, "vocab_size", 32000) : size_field(config, "vocab_size");
  if (!llama && (config.contains("classifier_pooling") || config.contains("classifier_activation")))
    throw Refusal("config.json: classifier keys not followed by ckptfs yet");
  c.rms_norm_eps = number_field(config, "rms_norm_eps", 1e-6);
  if (c.vocab_size == 32016 || c.vocab_size == 49152)
    throw Refusal(
        "config.json: a CodeLlama or Granite vocabulary size (the converter adds tokens ckptfs does not)");
  if (config.value("is_causal", json()) == json(false)) throw Refusal("config.json: is_causal false");
  if (config.contains("quantization_config")) throw Refusal("config.json: a quantized model");
  if (c.head_dim % 2 != 0 || c.heads % c.kv_heads != 0)
    throw Refusal("config.json: head sizes the converter cannot permute");
  // transformers 5 reads rope_parameters, or rope_scaling with a top-level rope_theta
  json rope = config.value("rope_parameters", json());
  if (!rope.is_object()) rope = config.value("rope_scaling", json());
  if (!rope.is_object()) rope = json::object();
  c.rope_theta = number_field(rope, "rope_theta", number_field(config, "rope_theta", 10000.0));
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "llama3" && llama) {
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
  if (c.head_dim_key) {
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
  }
  kv.add_u32("general.file_type", file_type);
  if (c.family == Family::llama) {  // conversion/llama.py's own
    u32("vocab_size", c.vocab_size);
    u32("rope.dimension_count", c.head_dim);
  }
}

std::vector<GgufTensor> llama_tensors(const std::shared_ptr<const catalog::Catalog>& hf, const LlamaConfig& c,
                                      GgmlType type) {
  std::vector<GgufTensor> out;
  if (c.llama3_rope) {
    auto factors = llama3_rope_factors(c);
    out.push_back({"rope_freqs.weight", {factors.size()}, GgmlType::f32, ComputedF32{std::move(factors)}});
  }
  for (size_t i : converter_order(*hf)) {
    const auto& t = hf->tensors[i];
    if (t.name.ends_with(".rotary_emb.inv_freq")) continue;  // skipped by the converter
    const std::string name = llama_name(t.name);
    if (name.empty()) throw Refusal(fmt::format("the converter cannot map tensor {}", t.name));
    GgufTensor g = converted_tensor(name, {hf, i}, type);
    const bool q = t.name.ends_with("q_proj.weight") || t.name.ends_with("q_proj.bias");
    const bool k = t.name.ends_with("k_proj.weight") || t.name.ends_with("k_proj.bias");
    if ((q || k) && c.family == Family::llama) {
      const uint64_t heads = q ? c.heads : c.kv_heads;
      if (static_cast<uint64_t>(t.shape[0]) % (2 * heads) != 0)
        throw Refusal(
            fmt::format("tensor {}: {} rows cannot be permuted over {} heads", t.name, t.shape[0], heads));
      std::get<SourceRows>(g.elements).permute_heads = heads;
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace ckptfs::views::gguf
