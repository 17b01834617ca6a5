#include "formats/save_dir.hpp"

#include "ckptfs/io_tree.hpp"
#include "formats/natural_order.hpp"

namespace ckptfs::formats {

namespace fs = std::filesystem;

std::vector<fs::path> sorted_subdirs(const io::Source& source, const fs::path& dir,
                                     const std::function<bool(const fs::path&)>& keep) {
  std::vector<fs::path> out;
  for (const auto& entry : source.list_directory(dir))
    if (entry.is_directory && keep(entry.path)) out.push_back(entry.path);
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return natural_less(a.filename().string(), b.filename().string());
  });
  return out;
}

std::vector<fs::path> side_files(const io::Source& source, const fs::path& dir,
                                 const std::function<bool(const std::string& name)>& is_data) {
  std::vector<fs::path> out;
  for (const auto& entry : source.list_directory(dir))
    if (entry.is_file && !is_data(entry.path.filename().string())) out.push_back(entry.path);
  std::sort(out.begin(), out.end());
  return out;
}

bool is_decimal(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::optional<std::string> read_tracker(const io::Source& source, const fs::path& file) {
  auto read = source.read_small_file(file, uint64_t{1} << 20);
  if (!read) return std::nullopt;
  std::string text = read->substr(0, read->find('\0'));
  text.erase(0, text.find_first_not_of(" \t\r\n"));
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  return text;
}

}  // namespace ckptfs::formats
