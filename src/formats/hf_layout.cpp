#include "formats/hf_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/json_file.hpp"

namespace ckptfs::formats {

namespace fs = std::filesystem;

namespace {

// Bounds on what a config.json may ask for (the file is untrusted): each size, each parameter's elements and
// the number of parameters, far above any real model, so that neither a product overflows nor the table grows
// without bound.
constexpr int64_t kMaxConfigSize = int64_t{1} << 24;
constexpr int64_t kMaxParameterElements = int64_t{1} << 40;
constexpr size_t kMaxParameters = size_t{1} << 18;

using Shape = std::vector<int64_t>;

constexpr HfFamily kFamilies[] = {HfFamily::llama,     HfFamily::qwen2,   HfFamily::gpt2,     HfFamily::qwen3,
                                  HfFamily::qwen3_moe, HfFamily::mixtral, HfFamily::qwen2_moe};

class LayoutBuilder {
 public:
  explicit LayoutBuilder(std::vector<HfParameter>& out) : out_(out) {}
  // Throws FormatError (no file: layout_from_config names it) past kMaxParameters or kMaxParameterElements.
  void add(std::string name, Shape shape) {
    __int128 elements = 1;  // each factor at most kMaxConfigSize: no overflow before the cap
    for (const auto n : shape)
      elements =
          n < 0 ? kMaxParameterElements + 1 : std::min<__int128>(elements * n, kMaxParameterElements + 1);
    if (elements > kMaxParameterElements || out_.size() >= kMaxParameters)
      throw FormatError(fmt::format("{} of {} dimensions or the {}th parameter: sizes far beyond any model",
                                    name, shape.size(), out_.size() + 1));
    out_.push_back({std::move(name), std::move(shape), ""});
  }
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

bool is_moe(HfFamily family) {
  return family == HfFamily::qwen3_moe || family == HfFamily::mixtral || family == HfFamily::qwen2_moe;
}

// A SwiGLU MLP (LlamaMLP and its copies): gate_proj, up_proj, down_proj under `p`.
void dense_mlp(const std::string& p, int64_t hidden, int64_t intermediate, bool bias, LayoutBuilder& b) {
  b.linear(p + "gate_proj", hidden, intermediate, bias);
  b.linear(p + "up_proj", hidden, intermediate, bias);
  b.linear(p + "down_proj", intermediate, hidden, bias);
}

// A sparse MoE block as transformers 5 creates it: the experts fused into 3-D parameters (gate and up rows
// stacked per expert), the router a bare [experts, hidden] parameter (modeling_qwen3_moe.py: experts, then
// gate; modeling_mixtral.py and modeling_qwen2_moe.py: gate, then experts; Qwen2-MoE then its shared expert,
// a dense MLP, and the shared expert's [1, hidden] sigmoid gate). Checkpoints on disk name each expert's
// projections apart (model.layers.{l}.mlp.experts.{e}.gate_proj.weight, Mixtral's
// block_sparse_moe.experts.{e}.w1.weight): transformers converts them when it loads.
void moe_parameters(HfFamily family, const HfDims& d, const std::string& p, LayoutBuilder& b) {
  const auto gate = [&] { b.add(p + "mlp.gate.weight", {d.experts, d.hidden}); };
  if (family != HfFamily::qwen3_moe) gate();
  b.add(p + "mlp.experts.gate_up_proj", {d.experts, 2 * d.moe_intermediate, d.hidden});
  b.add(p + "mlp.experts.down_proj", {d.experts, d.hidden, d.moe_intermediate});
  if (family == HfFamily::qwen3_moe) gate();
  if (family == HfFamily::qwen2_moe) {
    dense_mlp(p + "mlp.shared_expert.", d.hidden, d.shared_intermediate, false, b);
    b.linear(p + "mlp.shared_expert_gate", d.hidden, 1, false);
  }
}

// LlamaForCausalLM, Qwen2(Moe)ForCausalLM, Qwen3(Moe)ForCausalLM and MixtralForCausalLM (transformers'
// modeling_llama.py, modeling_qwen2*.py, modeling_qwen3*.py, modeling_mixtral.py): the same attention and
// norms; Qwen2 has biases on q, k and v only, Qwen3 adds per-head RMSNorms of q and k after o_proj.
void llama_parameters(HfFamily family, const HfDims& d, LayoutBuilder& b) {
  const bool qwen3 = family == HfFamily::qwen3 || family == HfFamily::qwen3_moe;
  const bool qkv_bias = family == HfFamily::qwen2 || d.attention_bias;  // Qwen2-MoE: its qkv_bias
  const bool o_bias = (family == HfFamily::llama || qwen3) && d.attention_bias;
  const bool mlp_bias = family == HfFamily::llama && d.mlp_bias;
  b.add("model.embed_tokens.weight", {d.vocab, d.hidden});
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    b.linear(p + "self_attn.q_proj", d.hidden, d.heads * d.head_dim, qkv_bias);
    b.linear(p + "self_attn.k_proj", d.hidden, d.kv_heads * d.head_dim, qkv_bias);
    b.linear(p + "self_attn.v_proj", d.hidden, d.kv_heads * d.head_dim, qkv_bias);
    b.linear(p + "self_attn.o_proj", d.heads * d.head_dim, d.hidden, o_bias);
    if (qwen3) {
      b.layer_norm(p + "self_attn.q_norm", d.head_dim, false);
      b.layer_norm(p + "self_attn.k_norm", d.head_dim, false);
    }
    if (is_moe(family) && !std::binary_search(d.dense_layers.begin(), d.dense_layers.end(), l)) {
      moe_parameters(family, d, p, b);
    } else {
      dense_mlp(p + "mlp.", d.hidden, d.intermediate, mlp_bias, b);
    }
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
    if (!json_[key].is_number_integer() || json_[key].get<int64_t>() <= 0 ||
        json_[key].get<int64_t>() > kMaxConfigSize)
      fail(fmt::format("{} is {}, expected a positive integer up to {}", key, json_[key].dump(),
                       kMaxConfigSize));
    return json_[key].get<int64_t>();
  }
  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }
  bool flag(const char* key, bool fallback) const {
    if (!json_.contains(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_boolean())
      fail(fmt::format("{} is {}, expected true or false", key, json_[key].dump()));
    return json_[key].get<bool>();
  }
  // Qwen3-MoE's dense layers: those of mlp_only_layers and, with decoder_sparse_step n, every layer l with
  // (l + 1) % n != 0 (Qwen3MoeDecoderLayer), ascending.
  std::vector<int64_t> dense_layers(int64_t layers) const {
    std::vector<bool> dense(static_cast<size_t>(layers), false);
    const int64_t step = positive("decoder_sparse_step", 1);
    for (int64_t l = 0; l < layers; ++l) dense[static_cast<size_t>(l)] = (l + 1) % step != 0;
    if (has("mlp_only_layers")) {
      const auto& list = json_["mlp_only_layers"];
      if (!list.is_array())
        fail(fmt::format("mlp_only_layers is {}, expected a list of layer numbers", list.dump()));
      for (const auto& l : list) {
        if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers)
          fail(fmt::format("mlp_only_layers holds {}, expected layer numbers below num_hidden_layers {}",
                           l.dump(), layers));
        dense[l.get<size_t>()] = true;
      }
    }
    std::vector<int64_t> out;
    for (int64_t l = 0; l < layers; ++l)
      if (dense[static_cast<size_t>(l)]) out.push_back(l);
    return out;
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
  if (family == HfFamily::llama || family == HfFamily::qwen3 || family == HfFamily::qwen3_moe)
    d.attention_bias = c.flag("attention_bias", false);
  if (family == HfFamily::llama) d.mlp_bias = c.flag("mlp_bias", false);
  if (family == HfFamily::qwen2_moe) {
    d.attention_bias = c.flag("qkv_bias", true);  // q/k/v only (Qwen2MoeAttention)
    d.experts = c.positive("num_experts");
    d.moe_intermediate = c.positive("moe_intermediate_size");
    d.shared_intermediate = c.positive("shared_expert_intermediate_size");
    d.dense_layers = c.dense_layers(d.layers);
  } else if (family == HfFamily::qwen3_moe) {
    // Qwen3MoeConfig maps num_experts to num_local_experts (transformers 5 writes the latter)
    d.experts = c.has("num_local_experts") ? c.positive("num_local_experts") : c.positive("num_experts");
    d.moe_intermediate = c.positive("moe_intermediate_size");
    d.dense_layers = c.dense_layers(d.layers);
  } else if (family == HfFamily::mixtral) {
    d.experts = c.positive("num_local_experts");
    d.moe_intermediate = d.intermediate;
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
    case HfFamily::qwen3:
      return "qwen3";
    case HfFamily::qwen3_moe:
      return "qwen3_moe";
    case HfFamily::mixtral:
      return "mixtral";
    case HfFamily::qwen2_moe:
      return "qwen2_moe";
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
    case HfFamily::qwen3:
      return "Qwen3ForCausalLM";
    case HfFamily::qwen3_moe:
      return "Qwen3MoeForCausalLM";
    case HfFamily::mixtral:
      return "MixtralForCausalLM";
    case HfFamily::qwen2_moe:
      return "Qwen2MoeForCausalLM";
  }
  throw std::logic_error("unknown family");
}

HfLayout layout_of(HfFamily family, const HfDims& dims) {
  HfLayout out{family, dims, {}};
  LayoutBuilder b(out.parameters);
  if (family == HfFamily::gpt2)
    gpt2_parameters(dims, b);
  else
    llama_parameters(family, dims, b);
  return out;
}

std::variant<HfLayout, std::string> layout_from_config(const io::Source& source,
                                                       const fs::path& config_json) {
  const nlohmann::json json = read_json_object(source, config_json);
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
  for (const HfFamily family : kFamilies) {
    if (name != architecture_name(family) && name != model_type(family)) continue;
    try {
      const HfDims dims = family == HfFamily::gpt2 ? gpt2_dims(fields) : llama_dims(fields, family);
      try {
        return layout_of(family, dims);
      } catch (const FormatError& e) {
        throw FormatError(fmt::format("{}: {}", config_json.string(), e.what()));
      }
    } catch (const UnsupportedError& e) {
      return std::string(e.what());
    }
  }
  std::string known;
  for (const HfFamily family : kFamilies)
    known += (known.empty() ? "" : ", ") + std::string(architecture_name(family));
  return fmt::format("architecture {} is not in ckptfs's table of model families ({})", name, known);
}

std::vector<fs::path> config_files(const OpenOptions& options, const fs::path& tag_dir,
                                   const fs::path& root) {
  std::vector<fs::path> out;
  if (options.model_config) out.push_back(*options.model_config);
  out.push_back(tag_dir / "config.json");
  out.push_back(root / "config.json");
  return out;
}

std::variant<HfLayout, std::string> layout_in(const io::Source& source,
                                              const std::vector<fs::path>& configs) {
  for (const auto& config : configs) {
    if (!source.is_file(config)) continue;
    try {
      return layout_from_config(source, config);
    } catch (const Error& e) {  // the weights are served all the same, under their saved names
      return e.what();
    }
  }
  return "no config.json names the model's architecture";
}

std::string layer_prefix(HfFamily family) {
  return family == HfFamily::gpt2 ? "transformer.h.{}." : "model.layers.{}.";
}

HfNameOrder name_order(HfFamily family) {
  // every optional bias present, and for the MoE families a sparse layer then a dense one: the order of any
  // model of the family is a subsequence of the layers' names merged in their order
  const HfDims dims{.vocab = 1,
                    .hidden = 1,
                    .intermediate = 1,
                    .layers = 2,
                    .heads = 1,
                    .kv_heads = 1,
                    .head_dim = 1,
                    .positions = 1,
                    .tied = false,
                    .attention_bias = true,
                    .mlp_bias = true,
                    .experts = 1,
                    .moe_intermediate = 1,
                    .shared_intermediate = 1,
                    .dense_layers = {1}};
  const std::string prefix = layer_prefix(family);
  const std::string_view head = std::string_view(prefix).substr(0, prefix.find("{}"));
  HfNameOrder out;
  size_t at = 0;  // where the next new name of this layer goes
  std::string layer;
  for (const auto& p : layout_of(family, dims).parameters) {
    std::string_view name = p.name;
    if (!name.starts_with(head)) {
      out.model.push_back(p.name);
      continue;
    }
    const size_t dot = name.find('.', head.size());
    if (out.layer.empty()) out.model.emplace_back();
    if (name.substr(0, dot) != layer) at = 0;
    layer = name.substr(0, dot);
    const std::string rest(name.substr(dot + 1));
    const auto found = std::find(out.layer.begin(), out.layer.end(), rest);
    if (found != out.layer.end()) {
      at = static_cast<size_t>(found - out.layer.begin()) + 1;
    } else {  // a name of this kind of layer only: right after the previous name of the layer
      out.layer.insert(out.layer.begin() + static_cast<ptrdiff_t>(at), rest);
      ++at;
    }
  }
  return out;
}

}  // namespace ckptfs::formats
