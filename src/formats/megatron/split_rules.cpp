#include "formats/megatron/split_rules.hpp"

namespace ckptfs::megatron {

namespace {

// "decoder.layers.3.mlp.linear_fc1.weight" -> "linear_fc1"
std::string_view module_of(std::string_view name) {
  const size_t last = name.rfind('.');
  if (last == std::string_view::npos) return name;
  const std::string_view owner = name.substr(0, last);
  const size_t dot = owner.rfind('.');
  return dot == std::string_view::npos ? owner : owner.substr(dot + 1);
}

// "weight" of "...linear_fc1.weight" and of TEGroupedMLP's "...linear_fc1.weight3"
std::string_view leaf_of(std::string_view name) {
  const size_t last = name.rfind('.');
  std::string_view leaf = last == std::string_view::npos ? name : name.substr(last + 1);
  while (!leaf.empty() && leaf.back() >= '0' && leaf.back() <= '9') leaf.remove_suffix(1);
  return leaf;
}

}  // namespace

Split split_of(std::string_view name, const ModelArgs& args) {
  const std::string_view module = module_of(name);
  const std::string_view leaf = leaf_of(name);
  if (leaf != "weight" && leaf != "bias") return Split::Replicated;  // TE's layer_norm_weight / _bias
  if (module == "word_embeddings" || module == "output_layer" || module == "word_embeddings_for_head" ||
      module == "linear_qkv" || module == "query_key_value")
    return Split::Rows;
  if (module == "linear_fc1" || module == "dense_h_to_4h")
    return args.swiglu ? Split::GatedRows : Split::Rows;
  if (leaf == "weight" &&
      (module == "linear_proj" || module == "linear_fc2" || module == "dense" || module == "dense_4h_to_h"))
    return Split::Columns;
  return Split::Replicated;
}

}  // namespace ckptfs::megatron
