#include "formats/megatron/hf_model.hpp"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ckptfs/error.hpp"
#include "formats/megatron/state_names.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;
using catalog::LogicalTensor;

namespace {

// How one merged tensor becomes Hugging Face tensors.
enum class Op { Copy, Vocab, Qkv, GateUp };

struct Rule {
  std::vector<std::string_view> suffixes;  // megatron-core and legacy names of the same parameter
  Op op;
  std::string hf;  // the HF name (within model.layers.N. for layer tensors); for Qkv / GateUp the module prefix
};

const std::vector<Rule>& layer_rules() {
  static const std::vector<Rule> kRules = {
      {{"input_layernorm.weight", "input_norm.weight", "self_attention.linear_qkv.layer_norm_weight"}, Op::Copy,
       "input_layernorm.weight"},
      {{"self_attention.linear_qkv.weight", "self_attention.query_key_value.weight"}, Op::Qkv, "weight"},
      {{"self_attention.linear_qkv.bias", "self_attention.query_key_value.bias"}, Op::Qkv, "bias"},
      {{"self_attention.linear_proj.weight", "self_attention.dense.weight"}, Op::Copy, "self_attn.o_proj.weight"},
      {{"self_attention.q_layernorm.weight"}, Op::Copy, "self_attn.q_norm.weight"},
      {{"self_attention.k_layernorm.weight"}, Op::Copy, "self_attn.k_norm.weight"},
      {{"pre_mlp_layernorm.weight", "post_attention_norm.weight", "post_attention_layernorm.weight",
        "mlp.linear_fc1.layer_norm_weight"},
       Op::Copy, "post_attention_layernorm.weight"},
      {{"mlp.linear_fc1.weight", "mlp.dense_h_to_4h.weight"}, Op::GateUp, "weight"},
      {{"mlp.linear_fc2.weight", "mlp.dense_4h_to_h.weight"}, Op::Copy, "mlp.down_proj.weight"},
  };
  return kRules;
}

const std::vector<Rule>& model_rules() {
  static const std::vector<Rule> kRules = {
      {{"word_embeddings.weight"}, Op::Vocab, "model.embed_tokens.weight"},
      {{"final_layernorm.weight", "final_norm.weight"}, Op::Copy, "model.norm.weight"},
      {{"output_layer.weight"}, Op::Vocab, "lm_head.weight"},
  };
  return kRules;
}

const Rule* find_rule(const std::vector<Rule>& rules, std::string_view name) {
  for (const auto& r : rules)
    for (auto s : r.suffixes)
      if (name == s || (name.ends_with(s) && name[name.size() - s.size() - 1] == '.')) return &r;
  return nullptr;
}

class HfBuilder {
 public:
  HfBuilder(const ModelArgs& args, catalog::Catalog& out) : args_(args), out_(out) {}

  void add(const LogicalTensor& t) {
    if (auto layer = parse_layer_name(t.name)) {
      const std::string rest = layer->rest.substr(1);
      const Rule* rule = find_rule(layer_rules(), rest);
      if (rule == nullptr) throw UnsupportedError(fmt::format("tensor {} has no Hugging Face counterpart", t.name));
      apply(*rule, t, fmt::format("model.layers.{}.", layer->index));
      return;
    }
    const Rule* rule = find_rule(model_rules(), t.name);
    if (rule == nullptr) throw UnsupportedError(fmt::format("tensor {} has no Hugging Face counterpart", t.name));
    apply(*rule, t, "");
  }

 private:
  void rows(const std::string& name, const LogicalTensor& t, std::vector<std::pair<int64_t, int64_t>> ranges) {
    std::vector<catalog::Box> boxes;
    int64_t at = 0;
    for (auto [begin, end] : ranges) {
      catalog::append_slice(boxes, t, 0, begin, end, at);
      at += end - begin;
    }
    std::vector<int64_t> shape = t.shape;
    shape[0] = at;
    out_.tensors.push_back(catalog::assembled_tensor(name, t.dtype, std::move(shape), std::move(boxes), t.name));
  }

  void apply(const Rule& rule, const LogicalTensor& t, const std::string& prefix) {
    switch (rule.op) {
      case Op::Copy:
        rows(prefix + rule.hf, t, {{0, t.shape.empty() ? 0 : t.shape[0]}});
        break;
      case Op::Vocab:
        rows(prefix + rule.hf, t, {{0, std::min(t.shape[0], args_.vocab.value_or(t.shape[0]))}});
        break;
      case Op::GateUp:
        rows(prefix + "mlp.gate_proj." + rule.hf, t, {{0, t.shape[0] / 2}});
        rows(prefix + "mlp.up_proj." + rule.hf, t, {{t.shape[0] / 2, t.shape[0]}});
        break;
      case Op::Qkv: {
        // Rows are grouped by query group: [q heads of the group, k, v] x kv_channels each.
        const int64_t hn = args_.kv_channels, groups = args_.query_groups, per_group = args_.heads / groups;
        std::vector<std::pair<int64_t, int64_t>> q, k, v;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t base = g * (per_group + 2) * hn;
          q.emplace_back(base, base + per_group * hn);
          k.emplace_back(base + per_group * hn, base + (per_group + 1) * hn);
          v.emplace_back(base + (per_group + 1) * hn, base + (per_group + 2) * hn);
        }
        rows(prefix + "self_attn.q_proj." + rule.hf, t, q);
        rows(prefix + "self_attn.k_proj." + rule.hf, t, k);
        rows(prefix + "self_attn.v_proj." + rule.hf, t, v);
        break;
      }
    }
  }

  const ModelArgs& args_;
  catalog::Catalog& out_;
};

// Why Hugging Face's Llama / Qwen2 code would not compute what Megatron computes; empty when it would.
std::string unsupported_reason(const ModelArgs& a) {
  if (!a.swiglu || a.position_embedding != "rope" || a.normalization != "RMSNorm")
    return fmt::format("only Llama-style models (SwiGLU, rope, RMSNorm) are mapped; this one has {}, {}, {}",
                       a.swiglu ? "SwiGLU" : "a non-gated MLP", a.position_embedding, a.normalization);
  if (a.num_experts > 0) return "mixture-of-experts models are not mapped yet";
  if (a.add_bias_linear) return "linear layers with biases (add_bias_linear) have no Llama counterpart";
  if (a.layernorm_1p) return "zero-centred norm weights (apply_layernorm_1p) are not mapped yet";
  if (a.rotary_interleaved) return "interleaved rotary embeddings are not mapped yet";
  if (a.query_groups <= 0 || a.heads % a.query_groups != 0) return "heads not divisible into query groups";
  return "";
}

std::string dtype_name(DType d) {
  return d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32";
}

std::string config_json(const ModelArgs& a, int64_t vocab, DType dtype) {
  const bool qwen2 = a.add_qkv_bias;
  nlohmann::ordered_json c;
  c["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = qwen2 ? "qwen2" : "llama";
  c["hidden_size"] = a.hidden;
  c["intermediate_size"] = a.ffn_hidden;
  c["num_hidden_layers"] = a.num_layers;
  c["num_attention_heads"] = a.heads;
  c["num_key_value_heads"] = a.query_groups;
  c["head_dim"] = a.kv_channels;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = a.max_positions;
  c["rms_norm_eps"] = a.norm_epsilon;
  // transformers >= 5 reads rope_parameters and dtype, earlier versions rope_theta and torch_dtype.
  c["rope_theta"] = a.rotary_base;
  c["rope_parameters"] = {{"rope_theta", a.rotary_base}, {"rope_type", "default"}};
  c["vocab_size"] = vocab;
  c["tie_word_embeddings"] = a.tied_embeddings;
  c["attention_bias"] = a.add_qkv_bias;
  if (!qwen2) c["mlp_bias"] = false;
  c["initializer_range"] = a.init_std;
  c["torch_dtype"] = dtype_name(dtype);
  c["dtype"] = dtype_name(dtype);
  return c.dump(2) + "\n";
}

bool is_tokenizer_file(const std::string& name) {
  static const std::set<std::string> kNames = {
      "tokenizer.json",   "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "vocab.json",
      "merges.txt",       "vocab.txt",             "added_tokens.json", "generation_config.json",
      "chat_template.jinja"};
  return kNames.contains(name);
}

}  // namespace

void add_hf_view(Tag& tag, const ModelArgs& args, const std::vector<std::vector<fs::path>>& side_files) {
  if (const std::string why = unsupported_reason(args); !why.empty()) {
    tag.notes.push_back("no hf/ view: " + why);
    return;
  }
  const auto& model = *tag.catalog("model");
  auto hf = std::make_shared<catalog::Catalog>();
  HfBuilder builder(args, *hf);
  try {
    for (const auto& t : model.tensors) builder.add(t);
  } catch (const UnsupportedError& e) {
    tag.notes.push_back(fmt::format("no hf/ view: {}", e.what()));
    return;
  }
  int64_t vocab = args.padded_vocab;
  DType dtype = args.params_dtype;
  for (const auto& t : hf->tensors)
    if (t.name == "model.embed_tokens.weight") {
      vocab = t.shape[0];
      dtype = t.dtype;
    }
  tag.catalogs.emplace("hf", std::move(hf));
  tag.extra_files.push_back({"hf/config.json", config_json(args, vocab, dtype), {}});
  std::map<std::string, fs::path> tokenizer;  // a later list (the iteration dir) wins
  for (const auto& list : side_files)
    for (const auto& f : list)
      if (is_tokenizer_file(f.filename().string())) tokenizer[f.filename().string()] = f;
  for (const auto& [name, path] : tokenizer) tag.extra_files.push_back({"hf/" + name, "", path});
}

}  // namespace ckptfs::megatron
