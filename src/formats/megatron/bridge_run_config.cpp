#include "formats/megatron/bridge_run_config.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/megatron/verl_layout.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxRunConfigBytes = uint64_t{16} << 20;

// Where a stack keeps the model's TransformerConfig: the mapping's key ("" for the whole file) and the
// stack's name.
struct YamlConfigPlace {
  const char* section;
  const char* writer;
};

// The fields of the config mapping, each read as the type ckptfs needs or a FormatError naming the file
// and the field. YAML's null (a dataclass field left None) counts as absent.
class ModelSection {
 public:
  ModelSection(YAML::Node model, const fs::path& file, YamlConfigPlace place)
      : model_(std::move(model)), file_(file), place_(place) {}

  bool has(const char* key) const { return model_[key] && !model_[key].IsNull(); }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, fmt::format("missing: {} saves the model's sizes here", place_.writer));
    }
    return as<int64_t>(key, "an integer");
  }
  int64_t positive(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    const int64_t v = integer(key, fallback);
    if (v <= 0 || v > (int64_t{1} << 40)) fail(key, fmt::format("{}, expected a positive integer", v));
    return v;
  }
  bool flag(const char* key, bool fallback) const {
    return has(key) ? as<bool>(key, "true or false") : fallback;
  }
  double number(const char* key, double fallback) const {
    return has(key) ? as<double>(key, "a number") : fallback;
  }
  std::string text(const char* key, std::string fallback) const {
    return has(key) ? as<std::string>(key, "a string") : fallback;
  }
  // moe_layer_freq: an int or a list of 0s and 1s, expanded over the layers (a string pattern, which Megatron
  // evaluates as Python, is refused: nothing from a config is executed)
  std::vector<int> moe_layer_pattern(const char* key, int64_t num_layers) const {
    const YAML::Node node = model_[key];
    std::vector<int> pattern;
    try {
      pattern = node.IsSequence() ? megatron::moe_layer_pattern(node.as<std::vector<int64_t>>(), num_layers)
                                  : megatron::moe_layer_pattern(node.as<int64_t>(), num_layers);
    } catch (const YAML::Exception&) {
    }
    if (pattern.empty())
      fail(key,
           fmt::format("expected a positive integer or a list of {} 0s and 1s (one per layer)", num_layers));
    return pattern;
  }
  // A Python object the config names by its import path: {_target_: torch.nn.functional.silu, _call_: false}.
  std::string target(const char* key) const {
    if (!has(key)) return "";
    const YAML::Node node = model_[key];
    if (!node.IsMap() || !node["_target_"]) fail(key, "expected a mapping with _target_");
    return node["_target_"].as<std::string>("");
  }

 private:
  template <typename T>
  T as(const char* key, const char* what) const {
    try {
      return model_[key].as<T>();
    } catch (const YAML::Exception&) {
      fail(key, fmt::format("expected {}", what));
    }
  }
  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    const std::string_view dot = *place_.section != '\0' ? "." : "";
    throw FormatError(fmt::format("{}: {}{}{}: {}", file_.string(), place_.section, dot, key, problem));
  }

  YAML::Node model_;
  const fs::path& file_;
  YamlConfigPlace place_;
};

// Megatron's vocabulary padding (should_pad_vocab): a multiple of make_vocab_size_divisible_by x TP.
int64_t padded_vocab(const ModelSection& m, int64_t vocab, int tp) {
  if (!m.flag("should_pad_vocab", false)) return vocab;
  const int64_t multiple = m.positive("make_vocab_size_divisible_by", 128) * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

YAML::Node load_yaml(const io::Source& source, const fs::path& file) {
  const auto text = source.read_small_file(file, kMaxRunConfigBytes);
  if (!text) throw SourceError(fmt::format("{}: cannot read", file.string()));
  try {
    return YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    throw FormatError(fmt::format("{}: not YAML: {}", file.string(), e.what()));
  }
}

// The `place.section:` mapping of `file` (a TransformerConfig dumped as YAML).
YAML::Node model_section(const io::Source& source, const fs::path& file, YamlConfigPlace place) {
  const YAML::Node root = load_yaml(source, file);
  if (!root.IsMap() || !root[place.section] || !root[place.section].IsMap())
    throw FormatError(fmt::format("{}: no {}: mapping ({} writes the model's config there)", file.string(),
                                  place.section, place.writer));
  return root[place.section];
}

// A TransformerConfig mapping (with the GPT model's own fields: vocabulary, positions, rope) as Megatron
// args.
ModelArgs read_model_config(const YAML::Node& section, const fs::path& run_config, YamlConfigPlace place) {
  const ModelSection m(section, run_config, place);
  ModelArgs a;
  a.tp = static_cast<int>(m.positive("tensor_model_parallel_size", 1));
  a.pp = static_cast<int>(m.positive("pipeline_model_parallel_size", 1));
  a.ep = static_cast<int>(m.positive("expert_model_parallel_size", 1));
  a.etp = static_cast<int>(m.positive("expert_tensor_parallel_size", a.tp));
  a.num_layers = m.positive("num_layers");
  a.hidden = m.positive("hidden_size");
  a.heads = m.positive("num_attention_heads");
  a.ffn_hidden = m.positive("ffn_hidden_size", 4 * a.hidden);
  a.query_groups = m.positive("num_query_groups", a.heads);
  a.kv_channels = m.positive("kv_channels", a.hidden / a.heads);
  a.vocab = m.positive("vocab_size");
  a.padded_vocab = padded_vocab(m, *a.vocab, a.tp);
  a.max_positions = m.positive("seq_length");
  a.num_experts = m.has("num_moe_experts") ? m.positive("num_moe_experts") : 0;
  a.moe_ffn_hidden = m.positive("moe_ffn_hidden_size", a.ffn_hidden);
  a.moe_topk = m.positive("moe_router_topk", 2);
  if (m.has("moe_layer_freq") && a.num_experts > 0) {
    a.moe_layer_pattern = m.moe_layer_pattern("moe_layer_freq", a.num_layers);
    a.moe_every_layer = std::ranges::count(a.moe_layer_pattern, 0) == 0;
  }
  a.moe_pre_softmax = m.flag("moe_router_pre_softmax", false);
  a.moe_softmax = m.text("moe_router_score_function", "softmax") == "softmax";
  a.moe_expert_bias = m.flag("moe_router_enable_expert_bias", false);
  a.moe_shared_ffn = m.integer("moe_shared_expert_intermediate_size", 0);
  a.moe_shared_gate = m.flag("moe_shared_expert_gate", false);
  a.moe_aux_loss_coeff = m.number("moe_aux_loss_coeff", 0.0);
  a.qk_layernorm = m.flag("qk_layernorm", false);
  // SwiGLU: a gated linear unit of SiLU (TransformerConfig's gated_linear_unit + activation_func)
  a.swiglu = m.flag("gated_linear_unit", false) && m.target("activation_func").ends_with(".silu");
  a.post_layernorm_residual = m.flag("apply_residual_connection_post_layernorm", false);
  a.tied_embeddings = m.flag("share_embeddings_and_output_weights", true);
  a.add_bias_linear = m.flag("add_bias_linear", true);
  a.add_qkv_bias = m.flag("add_qkv_bias", false);
  // Bridge's local_layer_spec builds the local modules even where transformer_impl says transformer_engine
  a.local_spec = m.text("transformer_impl", "transformer_engine") == "local" ||
                 m.target("transformer_layer_spec").ends_with("local_layer_spec");
  // megatron-core's local spec builds SequentialMLP experts whatever moe_grouped_gemm says
  // (LocalSpecProvider.grouped_mlp_modules): their names are local_experts.{e}.*, not weight{e}
  a.moe_grouped_gemm = m.flag("moe_grouped_gemm", false) && !a.local_spec;
  a.layernorm_1p = m.flag("layernorm_zero_centered_gamma", false);
  a.position_embedding = m.text("position_embedding_type", "learned_absolute");
  a.normalization = m.text("normalization", "LayerNorm");
  a.norm_epsilon = m.number("layernorm_epsilon", 1e-5);
  a.rotary_base = m.number("rotary_base", 10000);
  a.rotary_interleaved = m.flag("rotary_interleaved", false);
  a.rotary_percent = m.number("rotary_percent", 1.0);
  if (m.flag("rope_scaling", false)) a.rope_scaling_factor = m.number("rope_scaling_factor", 8.0);
  a.init_std = m.number("init_method_std", 0.02);
  a.params_dtype = m.flag("bf16", false) ? DType::BF16 : m.flag("fp16", false) ? DType::F16 : DType::F32;
  return a;
}

}  // namespace

ModelArgs read_bridge_model_config(const io::Source& source, const fs::path& run_config) {
  constexpr YamlConfigPlace kPlace{"model", "Megatron-Bridge"};
  return read_model_config(model_section(source, run_config, kPlace), run_config, kPlace);
}

ModelArgs read_nemo_model_config(const io::Source& source, const fs::path& model_yaml) {
  constexpr YamlConfigPlace kPlace{"config", "NeMo 2"};
  return read_model_config(model_section(source, model_yaml, kPlace), model_yaml, kPlace);
}

ModelArgs read_verl_model_config(const io::Source& source, const fs::path& transformer_config,
                                 const fs::path& hf_config) {
  // JSON is YAML; yaml-cpp also takes the NaN and Infinity json.dump writes for such floats
  YAML::Node config = load_yaml(source, transformer_config);
  if (!config.IsMap())
    throw FormatError(fmt::format("{}: not a mapping (verl dumps the model's TransformerConfig here)",
                                  transformer_config.string()));
  const HfModelConfig hf = read_hf_model_config(source, hf_config);
  // what verl's model initializer passes GPTModel from the HF config (no vocabulary padding), and the
  // activation its config converter sets (dropped from the dump as a callable)
  config["vocab_size"] = hf.vocab_size;
  config["seq_length"] = hf.max_positions;
  config["position_embedding_type"] = "rope";
  config["rotary_base"] = hf.rope_theta;
  config["share_embeddings_and_output_weights"] = hf.tied_embeddings;
  if (!config["activation_func"])
    config["activation_func"]["_target_"] = "torch.nn.functional." + hf.activation;
  return read_model_config(config, transformer_config, {"", "verl"});
}

}  // namespace ckptfs::megatron
