#include "formats/tag_selection.hpp"

#include <fstream>

namespace ckptfs::formats {

std::optional<std::string> read_tracker(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text, '\0');
  text.erase(0, text.find_first_not_of(" \t\r\n"));
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  return text;
}

}  // namespace ckptfs::formats
