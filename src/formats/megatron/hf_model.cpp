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
  Copy,         // as it is
  Vocab,        // the first `vocab` rows (padding dropped)
  Transpose,    // transposed: GPT-2's Conv1D stores [in, out]
  SplitQkv,     // q_proj, k_proj, v_proj out of the query-group-interleaved QKV (Llama)
  FusedQkv,     // one [q; k; v] tensor out of the per-head-interleaved QKV, transposed when 2-D (GPT-2)
  SplitGateUp,  // gate_proj and up_proj out of SwiGLU fc1 ([all gates; all ups])
};

struct Rule {
  std::vector<std::string_view>
      suffixes;  // megatron-core, TransformerEngine and legacy names of one parameter
  Op op;
  // The HF name (after the family's layer prefix for layer tensors; "{}" stands for an expert's number), or
  // for SplitQkv the leaf (weight, bias); for SplitGateUp the gate's name, and `up` the up projection's.
  std::string hf, up = {};
};

// A Hugging Face model family: how Megatron's tensors become its names, and its config.json. Its names'
// order and layer prefix come from the table of families (formats/hf_layout.hpp).
struct Family {
  formats::HfFamily family;
  std::vector<Rule> layer_rules, model_rules;
  std::function<nlohmann::ordered_json(const ModelArgs&, int64_t vocab)> config;
};

std::string dtype_name(DType d) {
  return d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32";
}

// How a family names a sparse block's router and routed experts ("{}": the expert's global number).
struct MoeNames {
  std::string router, gate, up, down;
};
// Qwen3-MoE's (modeling_qwen3_moe.py) and Mixtral's as their checkpoints store them (transformers converts
// both into the fused experts.gate_up_proj / down_proj when it loads, conversion_mapping.py)
const MoeNames kQwenMoeNames{"mlp.gate.weight", "mlp.experts.{}.gate_proj.weight",
                             "mlp.experts.{}.up_proj.weight", "mlp.experts.{}.down_proj.weight"};
const MoeNames kMixtralNames{"block_sparse_moe.gate.weight", "block_sparse_moe.experts.{}.w1.weight",
                             "block_sparse_moe.experts.{}.w3.weight",
                             "block_sparse_moe.experts.{}.w2.weight"};

// The layers of the Llama-like families (Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral): attention, norms (Qwen3's
// per-head q/k norms, weights of [kv_channels]), the SwiGLU MLP of dense layers and, with `moe`, the router
// and the routed experts under their expert-free names (see without_expert_number).
std::vector<Rule> llama_like_layer_rules(bool qk_norm, const MoeNames* moe) {
  std::vector<Rule> rules = {
      {{"input_layernorm.weight", "input_norm.weight", "self_attention.linear_qkv.layer_norm_weight"},
       Op::Copy,
       "input_layernorm.weight"},
      {{"self_attention.linear_qkv.weight", "self_attention.query_key_value.weight"}, Op::SplitQkv, "weight"},
      {{"self_attention.linear_qkv.bias", "self_attention.query_key_value.bias"}, Op::SplitQkv, "bias"},
      {{"self_attention.linear_proj.weight", "self_attention.dense.weight"},
       Op::Copy,
       "self_attn.o_proj.weight"},
      {{"pre_mlp_layernorm.weight", "post_attention_norm.weight", "post_attention_layernorm.weight",
        "mlp.linear_fc1.layer_norm_weight"},
       Op::Copy,
       "post_attention_layernorm.weight"},
      {{"mlp.linear_fc1.weight", "mlp.dense_h_to_4h.weight"},
       Op::SplitGateUp,
       "mlp.gate_proj.weight",
       "mlp.up_proj.weight"},
      {{"mlp.linear_fc2.weight", "mlp.dense_4h_to_h.weight"}, Op::Copy, "mlp.down_proj.weight"},
  };
  if (qk_norm) {
    rules.push_back({{"self_attention.q_layernorm.weight"}, Op::Copy, "self_attn.q_norm.weight"});
    rules.push_back({{"self_attention.k_layernorm.weight"}, Op::Copy, "self_attn.k_norm.weight"});
  }
  if (moe != nullptr) {
    rules.push_back({{"mlp.experts.linear_fc1.weight"}, Op::SplitGateUp, moe->gate, moe->up});
    rules.push_back({{"mlp.experts.linear_fc2.weight"}, Op::Copy, moe->down});
    rules.push_back({{"mlp.router.weight"}, Op::Copy, moe->router});
  }
  return rules;
}

std::vector<Rule> llama_like_model_rules() {
  return {
      {{"word_embeddings.weight"}, Op::Vocab, "model.embed_tokens.weight"},
      {{"final_layernorm.weight", "final_norm.weight"}, Op::Copy, "model.norm.weight"},
      {{"output_layer.weight"}, Op::Vocab, "lm_head.weight"},
  };
}

// config.json of the Llama-like families: what they share (transformers' LlamaConfig fields), then each
// family's own fields as its configuration class writes them.
nlohmann::ordered_json llama_like_config(const ModelArgs& a, int64_t vocab, std::string_view architecture,
                                         std::string_view model_type, int64_t intermediate) {
  nlohmann::ordered_json c;
  c["architectures"] = {architecture};
  c["model_type"] = model_type;
  c["hidden_size"] = a.hidden;
  c["intermediate_size"] = intermediate;
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
  c["initializer_range"] = a.init_std;
  return c;
}

// Qwen3's and Qwen3-MoE's sliding-window fields, off (Megatron's attention is full).
void no_sliding_window(nlohmann::ordered_json& c, const ModelArgs& a) {
  c["attention_bias"] = false;
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = a.num_layers;
}

const Family& llama() {
  static const Family kLlama{
      formats::HfFamily::llama, llama_like_layer_rules(false, nullptr), llama_like_model_rules(),
      [](const ModelArgs& a, int64_t vocab) {
        const bool qwen2 = a.add_qkv_bias;  // biases on q, k and v only: Qwen2's layout
        auto c = llama_like_config(a, vocab, qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
                                   qwen2 ? "qwen2" : "llama", a.ffn_hidden);
        c["attention_bias"] = a.add_qkv_bias;
        if (!qwen2) c["mlp_bias"] = false;
        return c;
      }};
  return kLlama;
}

const Family& qwen3() {
  static const Family kQwen3{
      formats::HfFamily::qwen3, llama_like_layer_rules(true, nullptr), llama_like_model_rules(),
      [](const ModelArgs& a, int64_t vocab) {
        auto c = llama_like_config(a, vocab, "Qwen3ForCausalLM", "qwen3", a.ffn_hidden);
        no_sliding_window(c, a);
        c["layer_types"] = std::vector<std::string>(static_cast<size_t>(a.num_layers), "full_attention");
        return c;
      }};
  return kQwen3;
}

// The layers Megatron's moe_layer_freq leaves dense (their MLP of ffn_hidden_size).
std::vector<int64_t> dense_layers(const ModelArgs& a) {
  std::vector<int64_t> out;
  for (size_t l = 0; l < a.moe_layer_pattern.size(); ++l)
    if (a.moe_layer_pattern[l] == 0) out.push_back(static_cast<int64_t>(l));
  return out;
}

// The MoE fields of transformers' Qwen2MoeConfig, Qwen3MoeConfig and MixtralConfig: the number of experts
// under `experts_key` (Qwen3MoeConfig and MixtralConfig write num_local_experts, Qwen2MoeConfig num_experts).
void moe_config(nlohmann::ordered_json& c, const ModelArgs& a, const char* experts_key) {
  c[experts_key] = a.num_experts;
  c["num_experts_per_tok"] = a.moe_topk;
  c["router_aux_loss_coef"] = a.moe_aux_loss_coeff;
  c["output_router_logits"] = false;
}

// Qwen2-MoE's and Qwen3-MoE's router and sparse layers. intermediate_size (llama_like_config) is the dense
// layers' MLP (mlp_only_layers).
void qwen_moe_config(nlohmann::ordered_json& c, const ModelArgs& a, const char* experts_key) {
  c["moe_intermediate_size"] = a.moe_ffn_hidden;
  moe_config(c, a, experts_key);
  // Megatron's softmax over the top-k experts' logits is the renormalised top-k probabilities; a softmax over
  // all experts first (moe_router_pre_softmax) leaves them unnormalised
  c["norm_topk_prob"] = !a.moe_pre_softmax;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = dense_layers(a);
}

const Family& qwen3_moe() {
  static const Family kQwen3Moe{formats::HfFamily::qwen3_moe, llama_like_layer_rules(true, &kQwenMoeNames),
                                llama_like_model_rules(), [](const ModelArgs& a, int64_t vocab) {
                                  auto c = llama_like_config(a, vocab, "Qwen3MoeForCausalLM", "qwen3_moe",
                                                             a.ffn_hidden);
                                  no_sliding_window(c, a);
                                  qwen_moe_config(c, a, "num_local_experts");
                                  return c;
                                }};
  return kQwen3Moe;
}

// Qwen2-MoE's shared expert (Qwen2MoeSparseMoeBlock.shared_expert, a dense SwiGLU MLP) and its sigmoid gate
// (shared_expert_gate, a Linear(hidden, 1)): Megatron's SharedExpertMLP with moe_shared_expert_gate.
std::vector<Rule> qwen2_moe_layer_rules() {
  auto rules = llama_like_layer_rules(false, &kQwenMoeNames);
  rules.push_back({{"mlp.shared_experts.linear_fc1.weight"},
                   Op::SplitGateUp,
                   "mlp.shared_expert.gate_proj.weight",
                   "mlp.shared_expert.up_proj.weight"});
  rules.push_back({{"mlp.shared_experts.linear_fc2.weight"}, Op::Copy, "mlp.shared_expert.down_proj.weight"});
  rules.push_back({{"mlp.shared_experts.gate_weight"}, Op::Copy, "mlp.shared_expert_gate.weight"});
  return rules;
}

const Family& qwen2_moe() {
  static const Family kQwen2Moe{formats::HfFamily::qwen2_moe, qwen2_moe_layer_rules(),
                                llama_like_model_rules(), [](const ModelArgs& a, int64_t vocab) {
                                  auto c = llama_like_config(a, vocab, "Qwen2MoeForCausalLM", "qwen2_moe",
                                                             a.ffn_hidden);
                                  c["qkv_bias"] = a.add_qkv_bias;
                                  c["use_sliding_window"] = false;
                                  c["sliding_window"] = nullptr;
                                  c["max_window_layers"] = a.num_layers;
                                  c["shared_expert_intermediate_size"] = a.moe_shared_ffn;
                                  qwen_moe_config(c, a, "num_experts");
                                  return c;
                                }};
  return kQwen2Moe;
}

const Family& mixtral() {
  static const Family kMixtral{formats::HfFamily::mixtral, llama_like_layer_rules(false, &kMixtralNames),
                               llama_like_model_rules(), [](const ModelArgs& a, int64_t vocab) {
                                 // Mixtral's intermediate_size is an expert's (it has no dense layers)
                                 auto c = llama_like_config(a, vocab, "MixtralForCausalLM", "mixtral",
                                                            a.moe_ffn_hidden);
                                 c["sliding_window"] = nullptr;
                                 moe_config(c, a, "num_local_experts");
                                 c["router_jitter_noise"] = 0.0;
                                 return c;
                               }};
  return kMixtral;
}

const Family& gpt2() {
  static const Family kGpt2{
      formats::HfFamily::gpt2,
      {
          {{"input_layernorm.weight", "input_norm.weight", "self_attention.linear_qkv.layer_norm_weight"},
           Op::Copy,
           "ln_1.weight"},
          {{"input_layernorm.bias", "input_norm.bias", "self_attention.linear_qkv.layer_norm_bias"},
           Op::Copy,
           "ln_1.bias"},
          {{"self_attention.linear_qkv.weight", "self_attention.query_key_value.weight"},
           Op::FusedQkv,
           "attn.c_attn.weight"},
          {{"self_attention.linear_qkv.bias", "self_attention.query_key_value.bias"},
           Op::FusedQkv,
           "attn.c_attn.bias"},
          {{"self_attention.linear_proj.weight", "self_attention.dense.weight"},
           Op::Transpose,
           "attn.c_proj.weight"},
          {{"self_attention.linear_proj.bias", "self_attention.dense.bias"}, Op::Copy, "attn.c_proj.bias"},
          {{"pre_mlp_layernorm.weight", "post_attention_norm.weight", "post_attention_layernorm.weight",
            "mlp.linear_fc1.layer_norm_weight"},
           Op::Copy,
           "ln_2.weight"},
          {{"pre_mlp_layernorm.bias", "post_attention_norm.bias", "post_attention_layernorm.bias",
            "mlp.linear_fc1.layer_norm_bias"},
           Op::Copy,
           "ln_2.bias"},
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
        c["n_inner"] =
            a.ffn_hidden == 4 * a.hidden ? nlohmann::ordered_json() : nlohmann::ordered_json(a.ffn_hidden);
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

// A routed expert's parameter under its expert-free name and its (global) number: SequentialMLP's
// mlp.experts.local_experts.{e}.linear_fc1.weight and TEGroupedMLP's mlp.experts.linear_fc1.weight{e} are
// both (mlp.experts.linear_fc1.weight, e); other names are returned as they are, number 0.
std::pair<std::string, int64_t> without_expert_number(std::string_view name) {
  if (!is_expert(name) || name.find("shared_experts") != std::string_view::npos)
    return {std::string(name), 0};
  constexpr std::string_view kLocal = "local_experts.";
  std::string out(name);
  int64_t expert = 0;
  if (const size_t at = out.find(kLocal); at != std::string::npos) {
    const size_t digits = at + kLocal.size(), stop = out.find('.', digits);
    std::from_chars(out.data() + digits, out.data() + stop, expert);
    out.erase(at, stop + 1 - at);
  } else {
    size_t digits = out.size();
    while (digits > 0 && out[digits - 1] >= '0' && out[digits - 1] <= '9') --digits;
    std::from_chars(out.data() + digits, out.data() + out.size(), expert);
    out.erase(digits);
  }
  return {out, expert};
}

class HfBuilder {
 public:
  HfBuilder(const ModelArgs& args, const Family& family, catalog::Catalog& out,
            std::shared_ptr<catalog::TransposeCache> transpose_cache)
      : args_(args), family_(family), out_(out), transpose_cache_(std::move(transpose_cache)) {}

  void add(const LogicalTensor& t) {
    if (auto layer = parse_layer_name(t.name)) {
      const auto [rest, expert] = without_expert_number(layer->rest.substr(1));
      const Rule* rule = find_rule(family_.layer_rules, rest);
      if (rule == nullptr)
        throw UnsupportedError(fmt::format("tensor {} has no Hugging Face counterpart", t.name));
      apply(*rule, t, fmt::format(fmt::runtime(formats::layer_prefix(family_.family)), layer->index), expert);
      return;
    }
    const Rule* rule = find_rule(family_.model_rules, t.name);
    if (rule == nullptr)
      throw UnsupportedError(fmt::format("tensor {} has no Hugging Face counterpart", t.name));
    apply(*rule, t, "");
  }

 private:
  // Rows `ranges` of `t` (dim 0), one after the other.
  LogicalTensor rows(const std::string& name, const LogicalTensor& t,
                     const std::vector<std::pair<int64_t, int64_t>>& ranges) {
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
  void emit_rows(const std::string& name, const LogicalTensor& t,
                 const std::vector<std::pair<int64_t, int64_t>>& ranges) {
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

  void apply(const Rule& rule, const LogicalTensor& t, const std::string& prefix, int64_t expert = 0) {
    const std::string leaf = t.name.substr(t.name.rfind('.') + 1);  // weight / bias
    const std::string hf = fmt::format(fmt::runtime(rule.hf), expert);
    const int64_t all = t.shape.empty() ? 0 : t.shape[0];
    switch (rule.op) {
      case Op::Copy:
        emit_rows(prefix + hf, t, {{0, all}});
        break;
      case Op::Vocab:
        emit_rows(prefix + rule.hf, t, {{0, std::min(all, args_.vocab.value_or(all))}});
        break;
      case Op::Transpose:
        emit(catalog::transposed_tensor(prefix + rule.hf, rows(prefix + rule.hf, t, {{0, all}}),
                                        transpose_cache_));
        break;
      case Op::SplitGateUp:
        emit_rows(prefix + hf, t, {{0, all / 2}});
        emit_rows(prefix + fmt::format(fmt::runtime(rule.up), expert), t, {{all / 2, all}});
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
        emit(t.shape.size() == 2 ? catalog::transposed_tensor(prefix + rule.hf, fused, transpose_cache_)
                                 : std::move(fused));
        break;
      }
    }
  }

  const ModelArgs& args_;
  const Family& family_;
  catalog::Catalog& out_;
  std::shared_ptr<catalog::TransposeCache> transpose_cache_;  // of the Conv1D weights (GPT-2)
};

// Why Megatron's router computes something else than every MoE family of the table, or "".
std::string moe_mismatch(const ModelArgs& a) {
  if (!a.moe_every_layer && a.moe_layer_pattern.empty())
    return "MoE layers beside dense ones (moe_layer_freq) in a pattern this config does not spell out";
  if (!a.moe_softmax)
    return "a sigmoid router (moe_router_score_function): every MoE family here takes a softmax";
  if (a.moe_expert_bias)
    return "the router's expert bias (moe_router_enable_expert_bias) takes part in choosing the experts; no "
           "router of Qwen2-MoE, Qwen3-MoE or Mixtral has such a term";
  return "";
}

// Qwen2-MoE with gated shared experts; Qwen3-MoE with q/k layernorm; Mixtral without either, when every layer
// is sparse and the top-k weights are renormalised (MixtralTopKRouter always renormalises them).
std::pair<const Family*, std::string> moe_family(const ModelArgs& a) {
  if (const std::string why = moe_mismatch(a); !why.empty()) return {nullptr, why};
  if (a.moe_shared_ffn > 0) {
    if (a.qk_layernorm)
      return {nullptr,
              "shared experts with q/k layernorm: Qwen2-MoE, the family with shared experts, has no q/k "
              "norms"};
    if (!a.moe_shared_gate)
      return {nullptr,
              "shared experts without a gate (moe_shared_expert_gate): Qwen2-MoE's shared expert is "
              "always scaled by its sigmoid gate"};
    return {&qwen2_moe(), ""};
  }
  if (a.qk_layernorm) return {&qwen3_moe(), ""};
  if (a.add_qkv_bias)
    return {nullptr, "MoE with q/k/v biases but no shared experts: Qwen2-MoE always has a shared expert"};
  if (!a.moe_every_layer)
    return {nullptr,
            "Mixtral (an MoE model without q/k layernorm) has no dense layers: moe_layer_freq leaves some"};
  if (a.moe_pre_softmax)
    return {nullptr,
            "Mixtral renormalises the top-k router probabilities; a softmax over all experts before the "
            "top-k (moe_router_pre_softmax) does not"};
  return {&mixtral(), ""};
}

std::pair<const Family*, std::string> llama_like_family(const ModelArgs& a) {
  if (a.add_bias_linear)
    return {nullptr, "linear layers with biases (add_bias_linear) have no Llama counterpart"};
  if (a.rotary_percent != 1.0)
    return {nullptr, "partial rotary embeddings (rotary_percent) are not mapped yet"};
  if (a.qk_layernorm && a.add_qkv_bias)
    return {nullptr, "q/k layernorm with q/k/v biases is neither Qwen2 nor Qwen3"};
  if (a.num_experts == 0) return {a.qk_layernorm ? &qwen3() : &llama(), ""};
  return moe_family(a);
}

// The family whose code computes what Megatron computes for this model, or why there is none.
std::pair<const Family*, std::string> family_of(const ModelArgs& a) {
  if (a.layernorm_1p) return {nullptr, "zero-centred norm weights (apply_layernorm_1p) are not mapped yet"};
  if (a.rotary_interleaved) return {nullptr, "interleaved rotary embeddings are not mapped yet"};
  if (a.post_layernorm_residual)
    return {nullptr,
            "residual connections after the layernorm (apply_residual_connection_post_layernorm) have no "
            "Hugging Face counterpart here"};
  if (a.query_groups <= 0 || a.heads % a.query_groups != 0)
    return {nullptr, "heads not divisible into query groups"};
  if (a.swiglu && a.position_embedding == "rope" && a.normalization == "RMSNorm") return llama_like_family(a);
  if (a.num_experts > 0)
    return {nullptr,
            "only Qwen2-MoE-, Qwen3-MoE- and Mixtral-style (SwiGLU, rope, RMSNorm) MoE models are mapped"};
  if (!a.swiglu && a.position_embedding == "learned_absolute" && a.normalization == "LayerNorm") {
    if (a.squared_relu) return {nullptr, "GPT-2 uses GeLU; this model uses squared ReLU"};
    if (!a.add_bias_linear) return {nullptr, "GPT-2 has biases on every linear layer; this model has none"};
    if (a.query_groups != a.heads) return {nullptr, "GPT-2 has no grouped-query attention"};
    if (a.kv_channels * a.heads != a.hidden)
      return {nullptr, "GPT-2 needs heads x kv_channels = hidden_size"};
    return {&gpt2(), ""};
  }
  return {nullptr,
          fmt::format("only Llama-style (SwiGLU, rope, RMSNorm) and GPT-2-style (GeLU, learned positions, "
                      "LayerNorm) models are mapped; this one has {}, {}, {}",
                      a.swiglu ? "SwiGLU" : "a non-gated MLP", a.position_embedding, a.normalization)};
}

// A layer tensor's name as the model creates it: an expert's own projection
// (mlp.experts.{e}.gate_proj.weight, Mixtral's block_sparse_moe.experts.{e}.w1.weight: how checkpoints store
// them) under the fused parameter transformers 5 loads it into (mlp.experts.gate_up_proj), Mixtral's
// block_sparse_moe under mlp.
std::string as_created(std::string_view name) {
  for (const std::string_view block : {"mlp.experts.", "block_sparse_moe.experts."}) {
    if (!name.starts_with(block)) continue;
    if (name.ends_with(".down_proj.weight") || name.ends_with(".w2.weight")) return "mlp.experts.down_proj";
    return "mlp.experts.gate_up_proj";
  }
  if (name == "block_sparse_moe.gate.weight") return "mlp.gate.weight";
  return std::string(name);
}

// Puts `hf`'s tensors in the Hugging Face model's state_dict order (its modules' order of creation, which
// save_pretrained splits shards in: docs/mount.md, "Sharded views"; the builder emits them in Megatron's
// order; experts at their fused parameter's place, expert by expert: save_pretrained's own split of them is
// not checked); a name the family does not list stays last, in its order.
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
        return {layers_at, layer, index_in(order.layer, as_created(name.substr(end + 1 - name.data())))};
    }
    return {index_in(order.model, t.name), 0, 0};
  };
  std::stable_sort(hf.tensors.begin(), hf.tensors.end(),
                   [&](const LogicalTensor& a, const LogicalTensor& b) { return key(a) < key(b); });
}

bool is_tokenizer_file(const std::string& name) {
  static const std::set<std::string> kNames = {"tokenizer.json",
                                               "tokenizer_config.json",
                                               "tokenizer.model",
                                               "special_tokens_map.json",
                                               "vocab.json",
                                               "merges.txt",
                                               "vocab.txt",
                                               "added_tokens.json",
                                               "generation_config.json",
                                               "chat_template.jinja"};
  return kNames.contains(name);
}

}  // namespace

void add_hf_view(Tag& tag, const ModelArgs& args, const std::vector<std::vector<fs::path>>& side_files,
                 const std::optional<fs::path>& stack_config,
                 const std::shared_ptr<catalog::TransposeCache>& transpose_cache) {
  const auto [family, why] = family_of(args);
  if (family == nullptr) {
    tag.notes.push_back("no hf/ view: " + why);
    return;
  }
  auto hf = std::make_shared<catalog::Catalog>();
  HfBuilder builder(args, *family, *hf, transpose_cache);
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
  tag.notes.push_back(fmt::format("hf/: the model as Hugging Face's {} ({})",
                                  config["architectures"][0].get<std::string>(),
                                  config["model_type"].get<std::string>()));
  if (stack_config)
    tag.extra_files.push_back({.path = "hf/config.json", .bytes = PassedThrough{*stack_config}});
  else
    tag.extra_files.push_back({.path = "hf/config.json", .bytes = WrittenText{config.dump(2) + "\n"}});
  std::map<std::string, fs::path> tokenizer;  // a later list (the iteration dir) wins
  for (const auto& list : side_files)
    for (const auto& f : list)
      if (is_tokenizer_file(f.filename().string())) tokenizer[f.filename().string()] = f;
  for (const auto& [name, path] : tokenizer)
    tag.extra_files.push_back({.path = "hf/" + name, .bytes = PassedThrough{path}});
}

}  // namespace ckptfs::megatron
