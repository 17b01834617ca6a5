#include "views/gguf/hf_directory.hpp"

#include <fmt/format.h>

namespace ckptfs::views::gguf {

std::optional<nlohmann::json> HfDirectory::json(std::string_view name) const {
  const auto it = files.find(name);
  if (it == files.end()) return std::nullopt;
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw Refusal(fmt::format("{} is not JSON: {}", name, e.what()));
  }
  if (!parsed.is_object()) throw Refusal(fmt::format("{} is not a JSON object", name));
  return parsed;
}

}  // namespace ckptfs::views::gguf
