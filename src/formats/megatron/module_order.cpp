#include "formats/megatron/module_order.hpp"

#include <algorithm>
#include <array>
#include <charconv>

namespace ckptfs::megatron {

namespace {

// Module and parameter names, in an order that agrees with the registration order inside every parent:
// TransformerLayer (input_layernorm, self_attention, pre_cross_attn_layernorm, cross_attention,
// pre_mlp_layernorm, mlp), Attention (core_attention, linear_proj, then SelfAttention's linear_qkv,
// q_layernorm, k_layernorm / CrossAttention's linear_q, linear_kv), MoELayer (router, experts,
// shared_experts), MLP and SharedExpertMLP (linear_fc1, linear_fc2, gate_weight), TE's LayerNormLinear
// (layer_norm_weight, layer_norm_bias, weight, bias), norms (weight, bias), TopKRouter (weight, expert_bias),
// LanguageModelEmbedding (word_embeddings, position_embeddings, tokentype_embeddings).
constexpr std::array<std::string_view, 28> kNames = {"input_layernorm",
                                                     "self_attention",
                                                     "pre_cross_attn_layernorm",
                                                     "cross_attention",
                                                     "pre_mlp_layernorm",
                                                     "mlp",
                                                     "core_attention",
                                                     "linear_proj",
                                                     "linear_qkv",
                                                     "linear_q",
                                                     "linear_kv",
                                                     "q_layernorm",
                                                     "k_layernorm",
                                                     "router",
                                                     "experts",
                                                     "shared_experts",
                                                     "local_experts",
                                                     "linear_fc1",
                                                     "linear_fc2",
                                                     "gate_weight",
                                                     "layer_norm_weight",
                                                     "layer_norm_bias",
                                                     "weight",
                                                     "bias",
                                                     "expert_bias",
                                                     "word_embeddings",
                                                     "position_embeddings",
                                                     "tokentype_embeddings"};

std::optional<int64_t> number(std::string_view s) {
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return n;
}

// Appends (rank, number) for each dot-separated component of `path`: a known name, a ModuleList index
// (local_experts.3), or a known name followed by a number (TEGroupedMLP's weight3).
bool append_components(std::string_view path, std::vector<int64_t>& key) {
  while (!path.empty()) {
    const size_t dot = path.find('.');
    std::string_view part = path.substr(0, dot);
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
    if (const auto n = number(part)) {
      key.insert(key.end(), {-1, *n});
      continue;
    }
    size_t digits = part.size();
    auto it =
        std::find(kNames.begin(), kNames.end(), part);  // linear_fc1 is a name, weight3 a name and a number
    if (it == kNames.end()) {
      while (digits > 0 && part[digits - 1] >= '0' && part[digits - 1] <= '9') --digits;
      it = std::find(kNames.begin(), kNames.end(), part.substr(0, digits));
    }
    if (it == kNames.end()) return false;
    const auto suffix = number(part.substr(digits));
    key.insert(key.end(), {it - kNames.begin(), suffix ? *suffix + 1 : 0});
  }
  return true;
}

}  // namespace

std::optional<std::vector<int64_t>> module_order_key(std::string_view name) {
  // GPTModel: embedding, decoder (layers, then final_layernorm), output_layer.
  static constexpr std::pair<std::string_view, int64_t> kTops[] = {
      {"embedding.", 0}, {"decoder.layers.", 1}, {"decoder.final_layernorm.", 2}, {"output_layer.", 3}};
  for (const auto& [prefix, rank] : kTops) {
    if (!name.starts_with(prefix)) continue;
    std::vector<int64_t> key = {rank};
    std::string_view rest = name.substr(prefix.size());
    if (rank == 1) {  // the layer number, then the layer's own path
      const size_t dot = rest.find('.');
      const auto layer = number(rest.substr(0, dot));
      if (!layer || dot == std::string_view::npos) return std::nullopt;
      key.push_back(*layer);
      rest = rest.substr(dot + 1);
    }
    if (!append_components(rest, key)) return std::nullopt;
    return key;
  }
  return std::nullopt;
}

bool module_order_known(const std::vector<catalog::LogicalTensor>& tensors) {
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const catalog::LogicalTensor& t) { return module_order_key(t.name).has_value(); });
}

void sort_into_module_order(std::vector<catalog::LogicalTensor>& tensors) {
  std::vector<std::pair<std::vector<int64_t>, size_t>> keys;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto key = module_order_key(tensors[i].name);
    if (!key) return;
    keys.emplace_back(std::move(*key), i);
  }
  std::sort(keys.begin(), keys.end());  // the index breaks ties: stable
  std::vector<catalog::LogicalTensor> sorted;
  sorted.reserve(tensors.size());
  for (const auto& [key, i] : keys) sorted.push_back(std::move(tensors[i]));
  tensors = std::move(sorted);
}

}  // namespace ckptfs::megatron
