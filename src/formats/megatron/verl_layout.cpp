#include "formats/megatron/verl_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/json_file.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/save_dir.hpp"
#include "formats/verl/steps.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTransformerConfig = "transformer_config.json";
constexpr int64_t kMaxSize = int64_t{1} << 40;

// `key` of `json` when it has `type` (json's own type test); nullopt when absent or null.
template <typename T>
std::optional<T> field(const nlohmann::json& json, const char* key,
                       bool (nlohmann::json::*type)() const noexcept, const char* expected,
                       const fs::path& file) {
  if (!json.contains(key) || json[key].is_null()) return std::nullopt;
  if (!(json[key].*type)())
    throw FormatError(
        fmt::format("{}: {} is {}, expected {}", file.string(), key, json[key].dump(), expected));
  return json[key].get<T>();
}

int64_t positive(const nlohmann::json& json, const char* key, const fs::path& file) {
  const auto v = field<int64_t>(json, key, &nlohmann::json::is_number_integer, "a positive integer", file);
  if (!v)
    throw FormatError(fmt::format("{}: {} is missing (verl builds the model with it)", file.string(), key));
  if (*v <= 0 || *v > kMaxSize)
    throw FormatError(fmt::format("{}: {} is {}, expected a positive integer", file.string(), key, *v));
  return *v;
}

}  // namespace

fs::path verl_dist_ckpt(const fs::path& role) {
  return role / "dist_ckpt";
}
fs::path verl_huggingface(const fs::path& role) {
  return role / "huggingface";
}

bool is_verl_megatron_role(const io::Source& source, const fs::path& dir) {
  return is_torch_dist_iteration(source, verl_dist_ckpt(dir)) &&
         (source.is_file(dir / kTransformerConfig) || source.is_directory(verl_huggingface(dir)));
}

std::vector<fs::path> verl_megatron_roles(const io::Source& source, const fs::path& step) {
  auto roles = formats::sorted_subdirs(source, step,
                                       [&](const fs::path& d) { return is_verl_megatron_role(source, d); });
  std::stable_partition(roles.begin(), roles.end(),
                        [](const fs::path& r) { return r.filename() == "actor"; });
  return roles;
}

std::vector<fs::path> verl_megatron_steps(const io::Source& source, const fs::path& run) {
  return formats::sorted_subdirs(source, run, [&](const fs::path& d) {
    return formats::verl::is_step_name(d.filename().string()) && !verl_megatron_roles(source, d).empty();
  });
}

HfModelConfig read_hf_model_config(const io::Source& source, const fs::path& config_json) {
  if (!source.is_file(config_json))
    throw FormatError(
        fmt::format("{}: missing (verl saves the model's HF config there)", config_json.string()));
  const nlohmann::json json = formats::read_json_object(source, config_json);
  HfModelConfig c;
  c.vocab_size = positive(json, "vocab_size", config_json);
  c.max_positions = positive(json, "max_position_embeddings", config_json);
  // transformers 5 writes rope_theta inside rope_parameters, earlier versions at the top
  const bool nested = json.contains("rope_parameters") && json["rope_parameters"].is_object() &&
                      json["rope_parameters"].contains("rope_theta");
  c.rope_theta = field<double>(nested ? json["rope_parameters"] : json, "rope_theta",
                               &nlohmann::json::is_number, "a number", config_json)
                     .value_or(c.rope_theta);
  c.tied_embeddings =
      field<bool>(json, "tie_word_embeddings", &nlohmann::json::is_boolean, "true or false", config_json)
          .value_or(c.tied_embeddings);
  c.activation = field<std::string>(json, "hidden_act", &nlohmann::json::is_string, "a string", config_json)
                     .value_or(c.activation);
  return c;
}

std::optional<VerlModelConfig> verl_model_config_of(const io::Source& source, const fs::path& dir) {
  const fs::path role = dir.parent_path();
  if (dir.filename() != "dist_ckpt" || !source.is_file(role / kTransformerConfig)) return std::nullopt;
  return VerlModelConfig{role / kTransformerConfig, verl_huggingface(role) / "config.json"};
}

}  // namespace ckptfs::megatron
