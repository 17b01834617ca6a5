#include "formats/fsdp/optimizer_shapes.hpp"

#include "formats/dcp/dcp_metadata.hpp"

namespace ckptfs::formats::fsdp {

std::map<std::string, std::vector<int64_t>> optimizer_parameter_shapes(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<int64_t>> out;
  if (dcp::metadata_files(dir).empty()) return out;
  constexpr std::string_view kState = "optimizer.state.";
  for (const auto& item : dcp::read_dir_metadata(dir).items) {
    const auto last_dot = item.fqn.rfind('.');
    if (!item.is_tensor || item.size.empty() || !item.fqn.starts_with(kState) || last_dot <= kState.size()) continue;
    out.emplace(item.fqn.substr(kState.size(), last_dot - kState.size()), item.size);
  }
  return out;
}

}  // namespace ckptfs::formats::fsdp
