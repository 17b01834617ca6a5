#include "formats/json_file.hpp"

#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"

namespace ckptfs::formats {

nlohmann::json read_json_object(const io::Source& source, const std::filesystem::path& path,
                                uint64_t max_bytes) {
  const auto text = source.read_small_file(path, max_bytes);
  if (!text) throw SourceError(fmt::format("{}: cannot read", path.string()));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: not JSON ({})", path.string(), e.what()));
  }
  if (!json.is_object()) throw FormatError(fmt::format("{}: not a JSON object", path.string()));
  return json;
}

}  // namespace ckptfs::formats
