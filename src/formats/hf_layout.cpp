#include "formats/hf_layout.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"

namespace ckptfs::formats {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

using Shape = std::vector<int64_t>;

class LayoutBuilder {
 public:
  explicit LayoutBuilder(std::vector<HfParameter>& out) : out_(out) {}
  void add(std::string name, Shape shape) { out_.push_back({std::move(name), std::move(shape), ""}); }
  // nn.Linear(in, out, bias): weight [out, in], then bias [out]
  void linear(const std::string& module, int64_t in, int64_t out, bool bias) {
    add(module + ".weight", {out, in});
    if (bias) add(module + ".bias", {out});
  }
  // GPT-2's Conv1D(nf=out, nx=in): weight [in, out], bias [out]
  void conv1d(const std::string& module, int64_t in, int64_t out) {
    add(module + ".weight", {in, out});
    add(module + ".bias", {out});
  }
  void layer_norm(const std::string& module, int64_t n, bool bias) {
    add(module + ".weight", {n});
    if (bias) add(module + ".bias", {n});
  }
  void lm_head(const HfDims& d, const std::string& embedding) {
    add("lm_head.weight", {d.vocab, d.hidden});
    if (d.tied) out_.back().tied_to = embedding;
  }

 private:
  std::vector<HfParameter>& out_;
};

// LlamaForCausalLM and Qwen2ForCausalLM (transformers' modeling_llama.py / modeling_qwen2.py): the same
// modules; Qwen2 has biases on q, k and v only.
void llama_parameters(HfFamily family, const HfDims& d, LayoutBuilder& b) {
  const bool qkv_bias = family == HfFamily::qwen2 || d.attention_bias;
  const bool o_bias = family == HfFamily::llama && d.attention_bias;
  const bool mlp_bias = family == HfFamily::llama && d.mlp_bias;
  b.add("model.embed_tokens.weight", {d.vocab, d.hidden});
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    b.linear(p + "self_attn.q_proj", d.hidden, d.heads * d.head_dim, qkv_bias);
    b.linear(p + "self_attn.k_proj", d.hidden, d.kv_heads * d.head_dim, qkv_bias);
    b.linear(p + "self_attn.v_proj", d.hidden, d.kv_heads * d.head_dim, qkv_bias);
    b.linear(p + "self_attn.o_proj", d.heads * d.head_dim, d.hidden, o_bias);
    b.linear(p + "mlp.gate_proj", d.hidden, d.intermediate, mlp_bias);
    b.linear(p + "mlp.up_proj", d.hidden, d.intermediate, mlp_bias);
    b.linear(p + "mlp.down_proj", d.intermediate, d.hidden, mlp_bias);
    b.layer_norm(p + "input_layernorm", d.hidden, false);
    b.layer_norm(p + "post_attention_layernorm", d.hidden, false);
  }
  b.layer_norm("model.norm", d.hidden, false);
  b.lm_head(d, "model.embed_tokens.weight");
}

// GPT2LMHeadModel (modeling_gpt2.py): Conv1D projections, LayerNorms with biases, learned positions.
void gpt2_parameters(const HfDims& d, LayoutBuilder& b) {
  b.add("transformer.wte.weight", {d.vocab, d.hidden});
  b.add("transformer.wpe.weight", {d.positions, d.hidden});
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    b.layer_norm(p + "ln_1", d.hidden, true);
    b.conv1d(p + "attn.c_attn", d.hidden, 3 * d.hidden);
    b.conv1d(p + "attn.c_proj", d.hidden, d.hidden);
    b.layer_norm(p + "ln_2", d.hidden, true);
    b.conv1d(p + "mlp.c_fc", d.hidden, d.intermediate);
    b.conv1d(p + "mlp.c_proj", d.intermediate, d.hidden);
  }
  b.layer_norm("transformer.ln_f", d.hidden, true);
  b.lm_head(d, "transformer.wte.weight");
}

class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& json, const fs::path& path) : json_(json), path_(path) {}

  int64_t positive(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!json_.contains(key) || json_[key].is_null()) {
      if (fallback) return *fallback;
      fail(fmt::format("{} is missing", key));
    }
    if (!json_[key].is_number_integer() || json_[key].get<int64_t>() <= 0 || json_[key].get<int64_t>() > (int64_t{1} << 40))
      fail(fmt::format("{} is {}, expected a positive integer", key, json_[key].dump()));
    return json_[key].get<int64_t>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!json_.contains(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_boolean()) fail(fmt::format("{} is {}, expected true or false", key, json_[key].dump()));
    return json_[key].get<bool>();
  }
  [[noreturn]] void fail(const std::string& problem) const {
    throw FormatError(fmt::format("{}: {}", path_.string(), problem));
  }

 private:
  const nlohmann::json& json_;
  const fs::path& path_;
};

HfDims llama_dims(const ConfigFields& c, HfFamily family) {
  HfDims d;
  d.vocab = c.positive("vocab_size");
  d.hidden = c.positive("hidden_size");
  d.intermediate = c.positive("intermediate_size");
  d.layers = c.positive("num_hidden_layers");
  d.heads = c.positive("num_attention_heads");
  d.kv_heads = c.positive("num_key_value_heads", d.heads);
  d.head_dim = c.positive("head_dim", d.hidden / d.heads);
  d.tied = c.flag("tie_word_embeddings", false);
  if (family == HfFamily::llama) {
    d.attention_bias = c.flag("attention_bias", false);
    d.mlp_bias = c.flag("mlp_bias", false);
  }
  return d;
}

HfDims gpt2_dims(const ConfigFields& c) {
  HfDims d;
  d.vocab = c.positive("vocab_size");
  d.hidden = c.positive("n_embd");
  d.layers = c.positive("n_layer");
  d.heads = c.positive("n_head");
  d.kv_heads = d.heads;
  d.head_dim = d.hidden / d.heads;
  d.positions = c.positive("n_positions");
  d.intermediate = c.positive("n_inner", 4 * d.hidden);
  d.tied = c.flag("tie_word_embeddings", true);
  return d;
}

}  // namespace

std::string_view model_type(HfFamily family) {
  switch (family) {
    case HfFamily::llama:
      return "llama";
    case HfFamily::qwen2:
      return "qwen2";
    case HfFamily::gpt2:
      return "gpt2";
  }
  throw std::logic_error("unknown family");
}

std::string_view architecture_name(HfFamily family) {
  switch (family) {
    case HfFamily::llama:
      return "LlamaForCausalLM";
    case HfFamily::qwen2:
      return "Qwen2ForCausalLM";
    case HfFamily::gpt2:
      return "GPT2LMHeadModel";
  }
  throw std::logic_error("unknown family");
}

HfLayout layout_of(HfFamily family, const HfDims& dims) {
  HfLayout out{family, dims, {}};
  LayoutBuilder b(out.parameters);
  if (family == HfFamily::gpt2) gpt2_parameters(dims, b);
  else llama_parameters(family, dims, b);
  return out;
}

std::variant<HfLayout, std::string> layout_from_config(const fs::path& config_json) {
  const auto text = io::read_small_file(config_json, kMaxConfigBytes);
  if (!text) throw SourceError(fmt::format("{}: cannot read", config_json.string()));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: not JSON ({})", config_json.string(), e.what()));
  }
  if (!json.is_object()) throw FormatError(fmt::format("{}: not a JSON object", config_json.string()));
  const ConfigFields fields(json, config_json);
  // save_pretrained of a bare config (no model) writes model_type without architectures: the causal LM of
  // that type is meant
  const auto& architectures = json.contains("architectures") ? json["architectures"] : nlohmann::json();
  std::string name;
  if (architectures.is_array() && architectures.size() == 1 && architectures[0].is_string())
    name = architectures[0].get<std::string>();
  else if (architectures.is_null() && json.contains("model_type") && json["model_type"].is_string())
    name = json["model_type"].get<std::string>();
  else
    return fmt::format("{} names no single architecture", config_json.filename().string());
  for (const HfFamily family : {HfFamily::llama, HfFamily::qwen2, HfFamily::gpt2}) {
    if (name != architecture_name(family) && name != model_type(family)) continue;
    const HfDims dims = family == HfFamily::gpt2 ? gpt2_dims(fields) : llama_dims(fields, family);
    return layout_of(family, dims);
  }
  return fmt::format("architecture {} is not in ckptfs's table of model families (LlamaForCausalLM, "
                     "Qwen2ForCausalLM, GPT2LMHeadModel)", name);
}

std::vector<fs::path> config_files(const OpenOptions& options, const fs::path& tag_dir, const fs::path& root) {
  std::vector<fs::path> out;
  if (options.model_config) out.push_back(*options.model_config);
  out.push_back(tag_dir / "config.json");
  out.push_back(root / "config.json");
  return out;
}

std::variant<HfLayout, std::string> layout_in(const std::vector<fs::path>& configs) {
  for (const auto& config : configs) {
    if (!io::is_file(config)) continue;
    try {
      return layout_from_config(config);
    } catch (const FormatError& e) {  // the weights are served all the same, under their saved names
      return e.what();
    }
  }
  return "no config.json names the model's architecture";
}

std::string layer_prefix(HfFamily family) {
  return family == HfFamily::gpt2 ? "transformer.h.{}." : "model.layers.{}.";
}

HfNameOrder name_order(HfFamily family) {
  // one layer, every optional bias present: the order of any model of the family is a subsequence
  const HfDims dims{.vocab = 1, .hidden = 1, .intermediate = 1, .layers = 1, .heads = 1, .kv_heads = 1,
                    .head_dim = 1, .positions = 1, .tied = false, .attention_bias = true, .mlp_bias = true};
  const std::string head = fmt::format(fmt::runtime(layer_prefix(family)), 0);
  HfNameOrder out;
  for (const auto& p : layout_of(family, dims).parameters) {
    if (p.name.starts_with(head)) {
      if (out.layer.empty()) out.model.emplace_back();
      out.layer.push_back(p.name.substr(head.size()));
    } else {
      out.model.push_back(p.name);
    }
  }
  return out;
}

}  // namespace ckptfs::formats
