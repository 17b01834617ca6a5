// The names of a list of (tag name, ...) pairs, for "no tag 'x' (tags: a, b)" messages.
#pragma once

#include <string>
#include <vector>

namespace ckptfs::formats {

template <typename Pairs>
std::vector<std::string> tag_names(const Pairs& pairs) {
  std::vector<std::string> out;
  for (const auto& p : pairs) out.push_back(p.first);
  return out;
}

}  // namespace ckptfs::formats
