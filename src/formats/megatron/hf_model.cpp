#include "formats/megatron/hf_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "ckptfs/error.hpp"
#include "formats/hf_layout.hpp"
#include "formats/megatron/state_names.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;
using catalog::LogicalTensor;

namespace {

// How one merged tensor becomes Hugging Face tensors.
enum class Op {
  Copy,        // as it is
  Vocab,       // the first `vocab` rows (padding dropped)
  Transpose,   // transposed: GPT-2's Conv1D stores [in, out]
  SplitQkv,    // q_proj, k_proj, v_proj out of the query-group-interleaved QKV (Llama)
  FusedQkv,    // one [q; k; v] tensor out of the per-head-interleaved QKV, transposed when 2-D (GPT-2)
  SplitGateUp, // gate_proj and up_proj out of SwiGLU fc1 ([all gates; all ups])
};

struct Rule {
  std::vector<std::string_view> suffixes;  // megatron-core, TransformerEngine and legacy names of one parameter
  Op op;
  std::string hf;  // the HF name (after the family's layer prefix for layer tensors), or the module for splits
};

// A Hugging Face model family: how Megatron's tensors become its names, and its config.json. Its names'
// order and layer prefix come from the table of families (formats/hf_layout.hpp).
struct Family {
  formats::HfFamily family;
  std::vector<Rule> layer_rules, model_rules;
  std::function<nlohmann::ordered_json(const ModelArgs&, int64_t vocab)> config;
};

std::string dtype_name(DType d) { return d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32"; }

const Family& llama() {
  static const Family kLlama{
      formats::HfFamily::llama,
      {
          {{"input_layernorm.weight", "input_norm.weight", "self_attention.linear_qkv.layer_norm_weight"}, Op::Copy,
           "input_layernorm.weight"},
          {{"self_attention.linear_qkv.weight", "self_attention.query_key_value.weight"}, Op::SplitQkv, "weight"},
          {{"self_attention.linear_qkv.bias", "self_attention.query_key_value.bias"}, Op::SplitQkv, "bias"},
          {{"self_attention.linear_proj.weight", "self_attention.dense.weight"}, Op::Copy, "self_attn.o_proj.weight"},
          {{"pre_mlp_layernorm.weight", "post_attention_norm.weight", "post_attention_layernorm.weight",
            "mlp.linear_fc1.layer_norm_weight"},
           Op::Copy, "post_attention_layernorm.weight"},
          {{"mlp.linear_fc1.weight", "mlp.dense_h_to_4h.weight"}, Op::SplitGateUp, "weight"},
          {{"mlp.linear_fc2.weight", "mlp.dense_4h_to_h.weight"}, Op::Copy, "mlp.down_proj.weight"},
      },
      {
          {{"word_embeddings.weight"}, Op::Vocab, "model.embed_tokens.weight"},
          {{"final_layernorm.weight", "final_norm.weight"}, Op::Copy, "model.norm.weight"},
          {{"output_layer.weight"}, Op::Vocab, "lm_head.weight"},
      },
      [](const ModelArgs& a, int64_t vocab) {
        const bool qwen2 = a.add_qkv_bias;  // biases on q, k and v only: Qwen2's layout
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
        // transformers >= 5 reads rope_parameters, earlier versions rope_theta and rope_scaling.
        nlohmann::ordered_json rope = {{"rope_theta", a.rotary_base}, {"rope_type", "default"}};
        c["rope_theta"] = a.rotary_base;
        if (a.rope_scaling_factor) {  // Megatron's Llama 3.1 scaling: fixed low/high factors and original length
          nlohmann::ordered_json scaling = {{"rope_type", "llama3"},
                                            {"factor", *a.rope_scaling_factor},
                                            {"low_freq_factor", 1.0},
                                            {"high_freq_factor", 4.0},
                                            {"original_max_position_embeddings", 8192}};
          c["rope_scaling"] = scaling;
          rope.update(scaling);
          rope["rope_theta"] = a.rotary_base;
        }
        c["rope_parameters"] = rope;
        c["vocab_size"] = vocab;
        c["tie_word_embeddings"] = a.tied_embeddings;
        c["attention_bias"] = a.add_qkv_bias;
        if (!qwen2) c["mlp_bias"] = false;
        c["initializer_range"] = a.init_std;
        return c;
      }};
  return kLlama;
}

const Family& gpt2() {
  static const Family kGpt2{
      formats::HfFamily::gpt2,
      {
          {{"input_layernorm.weight", "input_norm.weight", "self_attention.linear_qkv.layer_norm_weight"}, Op::Copy,
           "ln_1.weight"},
          {{"input_layernorm.bias", "input_norm.bias", "self_attention.linear_qkv.layer_norm_bias"}, Op::Copy,
           "ln_1.bias"},
          {{"self_attention.linear_qkv.weight", "self_attention.query_key_value.weight"}, Op::FusedQkv,
           "attn.c_attn.weight"},
          {{"self_attention.linear_qkv.bias", "self_attention.query_key_value.bias"}, Op::FusedQkv, "attn.c_attn.bias"},
          {{"self_attention.linear_proj.weight", "self_attention.dense.weight"}, Op::Transpose, "attn.c_proj.weight"},
          {{"self_attention.linear_proj.bias", "self_attention.dense.bias"}, Op::Copy, "attn.c_proj.bias"},
          {{"pre_mlp_layernorm.weight", "post_attention_norm.weight", "post_attention_layernorm.weight",
            "mlp.linear_fc1.layer_norm_weight"},
           Op::Copy, "ln_2.weight"},
          {{"pre_mlp_layernorm.bias", "post_attention_norm.bias", "post_attention_layernorm.bias",
            "mlp.linear_fc1.layer_norm_bias"},
           Op::Copy, "ln_2.bias"},
          {{"mlp.linear_fc1.weight", "mlp.dense_h_to_4h.weight"}, Op::Transpose, "mlp.c_fc.weight"},
          {{"mlp.linear_fc1.bias", "mlp.dense_h_to_4h.bias"}, Op::Copy, "mlp.c_fc.bias"},
          {{"mlp.linear_fc2.weight", "mlp.dense_4h_to_h.weight"}, Op::Transpose, "mlp.c_proj.weight"},
          {{"mlp.linear_fc2.bias", "mlp.dense_4h_to_h.bias"}, Op::Copy, "mlp.c_proj.bias"},
      },
      {
          {{"word_embeddings.weight"}, Op::Vocab, "transformer.wte.weight"},
          {{"position_embeddings.weight"}, Op::Copy, "transformer.wpe.weight"},
          {{"final_layernorm.weight", "final_norm.weight"}, Op::Copy, "transformer.ln_f.weight"},
          {{"final_layernorm.bias", "final_norm.bias"}, Op::Copy, "transformer.ln_f.bias"},
          {{"output_layer.weight"}, Op::Vocab, "lm_head.weight"},
      },
      [](const ModelArgs& a, int64_t vocab) {
        nlohmann::ordered_json c;
        c["architectures"] = {"GPT2LMHeadModel"};
        c["model_type"] = "gpt2";
        c["n_embd"] = a.hidden;
        c["n_layer"] = a.num_layers;
        c["n_head"] = a.heads;
        c["n_positions"] = a.max_positions;
        c["n_inner"] = a.ffn_hidden == 4 * a.hidden ? nlohmann::ordered_json() : nlohmann::ordered_json(a.ffn_hidden);
        c["activation_function"] = a.tanh_gelu ? "gelu_new" : "gelu";
        c["layer_norm_epsilon"] = a.norm_epsilon;
        c["vocab_size"] = vocab;
        c["tie_word_embeddings"] = a.tied_embeddings;
        c["initializer_range"] = a.init_std;
        return c;
      }};
  return kGpt2;
}

const Rule* find_rule(const std::vector<Rule>& rules, std::string_view name) {
  for (const auto& r : rules)
    for (auto s : r.suffixes)
      if (name == s || (name.ends_with(s) && name[name.size() - s.size() - 1] == '.')) return &r;
  return nullptr;
}

class HfBuilder {
 public:
  HfBuilder(const ModelArgs& args, const Family& family, catalog::Catalog& out)
      : args_(args), family_(family), out_(out) {}

  void add(const LogicalTensor& t) {
    if (auto layer = parse_layer_name(t.name)) {
      const Rule* rule = find_rule(family_.layer_rules, layer->rest.substr(1));
      if (rule == nullptr) throw UnsupportedError(fmt::format("tensor {} has no Hugging Face counterpart", t.name));
      apply(*rule, t, fmt::format(fmt::runtime(formats::layer_prefix(family_.family)), layer->index));
      return;
    }
    const Rule* rule = find_rule(family_.model_rules, t.name);
    if (rule == nullptr) throw UnsupportedError(fmt::format("tensor {} has no Hugging Face counterpart", t.name));
    apply(*rule, t, "");
  }

 private:
  // Rows `ranges` of `t` (dim 0), one after the other.
  LogicalTensor rows(const std::string& name, const LogicalTensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    std::vector<catalog::Box> boxes;
    int64_t at = 0;
    for (auto [begin, end] : ranges) {
      catalog::append_slice(boxes, t, 0, begin, end, at);
      at += end - begin;
    }
    std::vector<int64_t> shape = t.shape;
    shape[0] = at;
    return catalog::assembled_tensor(name, t.dtype, std::move(shape), std::move(boxes), t.name);
  }
  void emit(LogicalTensor t) { out_.tensors.push_back(std::move(t)); }
  void emit_rows(const std::string& name, const LogicalTensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    emit(rows(name, t, ranges));
  }

  // Row ranges of q, k and v in a QKV grouped as [q heads of the group, k, v] per query group (MHA: one
  // head per group).
  std::array<std::vector<std::pair<int64_t, int64_t>>, 3> qkv_rows() const {
    const int64_t hn = args_.kv_channels, groups = args_.query_groups, per_group = args_.heads / groups;
    std::array<std::vector<std::pair<int64_t, int64_t>>, 3> out;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = g * (per_group + 2) * hn;
      out[0].emplace_back(base, base + per_group * hn);
      out[1].emplace_back(base + per_group * hn, base + (per_group + 1) * hn);
      out[2].emplace_back(base + (per_group + 1) * hn, base + (per_group + 2) * hn);
    }
    return out;
  }

  void apply(const Rule& rule, const LogicalTensor& t, const std::string& prefix) {
    const std::string leaf = t.name.substr(t.name.rfind('.') + 1);  // weight / bias
    const int64_t all = t.shape.empty() ? 0 : t.shape[0];
    switch (rule.op) {
      case Op::Copy:
        emit_rows(prefix + rule.hf, t, {{0, all}});
        break;
      case Op::Vocab:
        emit_rows(prefix + rule.hf, t, {{0, std::min(all, args_.vocab.value_or(all))}});
        break;
      case Op::Transpose:
        emit(catalog::transposed_tensor(prefix + rule.hf, rows(prefix + rule.hf, t, {{0, all}})));
        break;
      case Op::SplitGateUp:
        emit_rows(prefix + "mlp.gate_proj." + leaf, t, {{0, all / 2}});
        emit_rows(prefix + "mlp.up_proj." + leaf, t, {{all / 2, all}});
        break;
      case Op::SplitQkv: {
        const auto [q, k, v] = qkv_rows();
        emit_rows(prefix + "self_attn.q_proj." + leaf, t, q);
        emit_rows(prefix + "self_attn.k_proj." + leaf, t, k);
        emit_rows(prefix + "self_attn.v_proj." + leaf, t, v);
        break;
      }
      case Op::FusedQkv: {
        auto [q, k, v] = qkv_rows();
        q.insert(q.end(), k.begin(), k.end());
        q.insert(q.end(), v.begin(), v.end());
        LogicalTensor fused = rows(prefix + rule.hf, t, q);
        emit(t.shape.size() == 2 ? catalog::transposed_tensor(prefix + rule.hf, fused) : std::move(fused));
        break;
      }
    }
  }

  const ModelArgs& args_;
  const Family& family_;
  catalog::Catalog& out_;
};

// The family whose code computes what Megatron computes for this model, or why there is none.
std::pair<const Family*, std::string> family_of(const ModelArgs& a) {
  if (a.num_experts > 0) return {nullptr, "mixture-of-experts models are not mapped yet"};
  if (a.layernorm_1p) return {nullptr, "zero-centred norm weights (apply_layernorm_1p) are not mapped yet"};
  if (a.rotary_interleaved) return {nullptr, "interleaved rotary embeddings are not mapped yet"};
  if (a.post_layernorm_residual)
    return {nullptr, "residual connections after the layernorm (apply_residual_connection_post_layernorm) have no "
                     "Hugging Face counterpart here"};
  if (a.query_groups <= 0 || a.heads % a.query_groups != 0) return {nullptr, "heads not divisible into query groups"};
  if (a.swiglu && a.position_embedding == "rope" && a.normalization == "RMSNorm") {
    if (a.add_bias_linear) return {nullptr, "linear layers with biases (add_bias_linear) have no Llama counterpart"};
    if (a.rotary_percent != 1.0) return {nullptr, "partial rotary embeddings (rotary_percent) are not mapped yet"};
    return {&llama(), ""};
  }
  if (!a.swiglu && a.position_embedding == "learned_absolute" && a.normalization == "LayerNorm") {
    if (a.squared_relu) return {nullptr, "GPT-2 uses GeLU; this model uses squared ReLU"};
    if (!a.add_bias_linear) return {nullptr, "GPT-2 has biases on every linear layer; this model has none"};
    if (a.query_groups != a.heads) return {nullptr, "GPT-2 has no grouped-query attention"};
    if (a.kv_channels * a.heads != a.hidden) return {nullptr, "GPT-2 needs heads x kv_channels = hidden_size"};
    return {&gpt2(), ""};
  }
  return {nullptr, fmt::format("only Llama-style (SwiGLU, rope, RMSNorm) and GPT-2-style (GeLU, learned positions, "
                               "LayerNorm) models are mapped; this one has {}, {}, {}",
                               a.swiglu ? "SwiGLU" : "a non-gated MLP", a.position_embedding, a.normalization)};
}

// Puts `hf`'s tensors in the Hugging Face model's state_dict order (its modules' order of creation, which
// save_pretrained splits shards in: docs/mount.md, "Sharded views"; the builder emits them in Megatron's
// order); a name the family does not list stays last, in its order.
void order_as_state_dict(catalog::Catalog& hf, const Family& family) {
  const formats::HfNameOrder order = formats::name_order(family.family);
  const auto index_in = [](const std::vector<std::string>& names, std::string_view name) {
    return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  const size_t layers_at = index_in(order.model, "");
  const std::string prefix = formats::layer_prefix(family.family);
  const std::string_view layer_head = std::string_view(prefix).substr(0, prefix.find("{}"));
  const auto key = [&](const LogicalTensor& t) -> std::tuple<size_t, uint64_t, size_t> {
    std::string_view name = t.name;
    if (name.starts_with(layer_head)) {
      name.remove_prefix(layer_head.size());
      uint64_t layer = 0;
      const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
      if (ec == std::errc() && end < name.data() + name.size() && *end == '.')
        return {layers_at, layer, index_in(order.layer, name.substr(end + 1 - name.data()))};
    }
    return {index_in(order.model, t.name), 0, 0};
  };
  std::stable_sort(hf.tensors.begin(), hf.tensors.end(),
                   [&](const LogicalTensor& a, const LogicalTensor& b) { return key(a) < key(b); });
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
  const auto [family, why] = family_of(args);
  if (family == nullptr) {
    tag.notes.push_back("no hf/ view: " + why);
    return;
  }
  auto hf = std::make_shared<catalog::Catalog>();
  HfBuilder builder(args, *family, *hf);
  try {
    for (const auto& t : tag.catalog(ViewRole::model)->tensors) builder.add(t);
    order_as_state_dict(*hf, *family);
  } catch (const UnsupportedError& e) {
    tag.notes.push_back(fmt::format("no hf/ view: {}", e.what()));
    return;
  }
  int64_t vocab = args.padded_vocab;
  DType dtype = args.params_dtype;
  for (const auto& t : hf->tensors)
    if (t.name.ends_with("embed_tokens.weight") || t.name == "transformer.wte.weight") {
      vocab = t.shape[0];
      dtype = t.dtype;
    }
  auto config = family->config(args, vocab);
  config["torch_dtype"] = dtype_name(dtype);  // transformers < 5
  config["dtype"] = dtype_name(dtype);
  tag.add(ViewRole::hf, std::move(hf));
  tag.extra_files.push_back({.path = "hf/config.json", .text = config.dump(2) + "\n", .source = {}});
  std::map<std::string, fs::path> tokenizer;  // a later list (the iteration dir) wins
  for (const auto& list : side_files)
    for (const auto& f : list)
      if (is_tokenizer_file(f.filename().string())) tokenizer[f.filename().string()] = f;
  for (const auto& [name, path] : tokenizer) tag.extra_files.push_back({.path = "hf/" + name, .text = {}, .source = path});
}

}  // namespace ckptfs::megatron
