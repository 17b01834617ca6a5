#include "formats/megatron/state_names.hpp"

#include <charconv>

namespace ckptfs::megatron {

namespace {

void flatten_into(const formats::Field& node, const std::string& prefix,
                  std::vector<std::pair<std::string, formats::Field>>& out) {
  for (auto& [key, child] : node.items()) {
    std::string name = prefix.empty() ? key : prefix + "." + key;
    if (child.is_dict())
      flatten_into(child, name, out);
    else
      out.emplace_back(std::move(name), child);
  }
}

}  // namespace

std::vector<std::pair<std::string, formats::Field>> flatten_state(const formats::Field& model) {
  std::vector<std::pair<std::string, formats::Field>> out;
  flatten_into(model, "", out);
  return out;
}

std::optional<LayerName> parse_layer_name(std::string_view name) {
  constexpr std::string_view kLayers = "layers.";
  for (size_t at = name.find(kLayers); at != std::string_view::npos; at = name.find(kLayers, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    const size_t digits = at + kLayers.size();
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(name.data() + digits, name.data() + name.size(), index);
    const size_t stop = end - name.data();
    if (ec != std::errc() || stop == digits || (stop < name.size() && name[stop] != '.')) continue;
    return LayerName{std::string(name.substr(0, digits)), index, std::string(name.substr(stop))};
  }
  return std::nullopt;
}

std::string shift_layer(std::string_view name, int64_t offset) {
  auto layer = parse_layer_name(name);
  if (!layer) return std::string(name);
  return layer->prefix + std::to_string(layer->index + offset) + layer->rest;
}

std::string local_spec_name(std::string_view name) {
  static constexpr std::pair<std::string_view, std::string_view> kRenames[] = {
      {"self_attention.linear_qkv.layer_norm_", "input_layernorm."},
      {"mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."},
  };
  for (const auto& [from, to] : kRenames)
    if (const size_t at = name.find(from); at != std::string_view::npos)
      return std::string(name.substr(0, at)) + std::string(to) + std::string(name.substr(at + from.size()));
  return std::string(name);
}

bool is_extra_state(std::string_view name) {
  const size_t dot = name.rfind('.');
  return name.substr(dot == std::string_view::npos ? 0 : dot + 1).starts_with("_extra_state");
}

bool is_expert(std::string_view name) {
  return name.find(".experts.") != std::string_view::npos;
}

std::string shift_expert(std::string_view name, int64_t offset) {
  constexpr std::string_view kLocal = ".local_experts.";
  size_t digits = name.find(kLocal);
  if (digits != std::string_view::npos) {
    digits += kLocal.size();
  } else {  // TEGroupedMLP: the number ends the name (linear_fc1.weight3)
    digits = name.size();
    while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
  }
  int64_t index = 0;
  const auto [end, ec] = std::from_chars(name.data() + digits, name.data() + name.size(), index);
  if (ec != std::errc() || end == name.data() + digits) return std::string(name);
  return std::string(name.substr(0, digits)) + std::to_string(index + offset) +
         std::string(name.substr(end - name.data()));
}

std::string expert_name(std::string_view layer_name, int64_t expert, bool grouped_gemm) {
  constexpr std::string_view kStacked = ".experts.experts.";
  const size_t at = layer_name.find(kStacked);
  if (at == std::string_view::npos) return std::string(layer_name);
  const std::string head(layer_name.substr(0, at));
  const std::string rest(layer_name.substr(at + kStacked.size()));  // linear_fc1.weight
  if (grouped_gemm) return head + ".experts." + rest + std::to_string(expert);
  return head + ".experts.local_experts." + std::to_string(expert) + "." + rest;
}

}  // namespace ckptfs::megatron
