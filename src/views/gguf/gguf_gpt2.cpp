#include "views/gguf/gguf_gpt2.hpp"

#include <fmt/format.h>

#include <regex>

#include "views/gguf/converted_tensor.hpp"
#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

uint64_t required_size(const json& config, const char* key) {
  const json v = config.value(key, json());
  if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 || v.get<uint64_t>() > (uint64_t{1} << 24))
    throw Refusal(fmt::format("config.json: {} missing or not a size (the converter reads it)", key));
  return v.get<uint64_t>();
}

// The GGUF name of a Hugging Face GPT-2 name (`transformer.` optional); empty when unmappable.
std::string gpt2_name(const std::string& hf) {
  static const std::regex kName(R"((?:transformer\.)?(.+))");
  std::smatch m;
  std::regex_match(hf, m, kName);
  const std::string rest = m[1];
  static const std::vector<std::pair<std::string, std::string>> kFixed = {
      {"wte.weight", "token_embd.weight"},
      {"wpe.weight", "position_embd.weight"},
      {"ln_f.weight", "output_norm.weight"},
      {"ln_f.bias", "output_norm.bias"},
      {"lm_head.weight", "output.weight"}};
  for (const auto& [from, to] : kFixed)
    if (rest == from || hf == from) return to;
  static const std::regex kLayer(R"(h\.(\d+)\.(.+)\.(weight|bias))");
  static const std::vector<std::pair<std::string, std::string>> kInLayer = {
      {"ln_1", "attn_norm"},          {"ln_2", "ffn_norm"},   {"attn.c_attn", "attn_qkv"},
      {"attn.c_proj", "attn_output"}, {"mlp.c_fc", "ffn_up"}, {"mlp.c_proj", "ffn_down"}};
  if (!std::regex_match(rest, m, kLayer)) return "";
  for (const auto& [from, to] : kInLayer)
    if (m[2] == from) return fmt::format("blk.{}.{}.{}", m[1].str(), to, m[3].str());
  return "";
}

}  // namespace

Gpt2Config read_gpt2_config(const json& config) {
  Gpt2Config c;
  c.layers = required_size(config, "n_layer");
  c.embedding = required_size(config, "n_embd");
  c.heads = required_size(config, "n_head");
  c.context = required_size(config, "n_ctx");
  if (const json eps = config.value("layer_norm_epsilon", json()); !eps.is_null()) {
    if (!eps.is_number()) throw Refusal("config.json: layer_norm_epsilon is not a number");
    c.layer_norm_epsilon = eps.get<double>();
  }
  return c;
}

void add_gpt2_parameters(KvList& kv, const Gpt2Config& c, uint32_t file_type) {
  kv.add_u32("gpt2.block_count", static_cast<uint32_t>(c.layers));
  kv.add_u32("gpt2.context_length", static_cast<uint32_t>(c.context));
  kv.add_u32("gpt2.embedding_length", static_cast<uint32_t>(c.embedding));
  kv.add_u32("gpt2.feed_forward_length", static_cast<uint32_t>(4 * c.embedding));  // n_inner ignored
  kv.add_u32("gpt2.attention.head_count", static_cast<uint32_t>(c.heads));
  kv.add_f32("gpt2.attention.layer_norm_epsilon", c.layer_norm_epsilon);
  kv.add_u32("general.file_type", file_type);
}

std::vector<GgufTensor> gpt2_tensors(const std::shared_ptr<const catalog::Catalog>& hf,
                                     std::span<const size_t> order, GgmlType type,
                                     const std::shared_ptr<catalog::TransposeCache>& transpose_cache) {
  // Conv1D weights are [in, out]: the converter writes them transposed
  auto transposed = std::make_shared<catalog::Catalog>();
  std::vector<std::optional<size_t>> transposed_index(hf->tensors.size());
  for (size_t i : order) {
    const auto& t = hf->tensors[i];
    if ((t.name.ends_with(".c_attn.weight") || t.name.ends_with(".c_proj.weight") ||
         t.name.ends_with(".c_fc.weight")) &&
        t.shape.size() == 2) {
      transposed_index[i] = transposed->tensors.size();
      transposed->tensors.push_back(catalog::transposed_tensor(t.name, t, transpose_cache));
    }
  }
  const std::shared_ptr<const catalog::Catalog> transposed_catalog = std::move(transposed);
  std::vector<GgufTensor> out;
  for (size_t i : order) {
    const auto& t = hf->tensors[i];
    const std::string name = gpt2_name(t.name);
    if (name.empty()) throw Refusal(fmt::format("the converter cannot map tensor {}", t.name));
    const catalog::TensorRef ref = transposed_index[i]
                                       ? catalog::TensorRef{transposed_catalog, *transposed_index[i]}
                                       : catalog::TensorRef{hf, i};
    out.push_back(converted_tensor(name, ref, type));
  }
  return out;
}

}  // namespace ckptfs::views::gguf
