// Paths of the tree as users write them (`ckptfs cat SRC VIEW_PATH`), and the names near a wrong one.
#include <algorithm>
#include <numeric>

#include "ckptfs/vfs.hpp"

namespace ckptfs::vfs {

namespace {

// Levenshtein distance: the fewest single-character insertions, deletions and substitutions.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

PathLookup lookup_path(const VirtualTree& tree, std::string_view path) {
  std::vector<std::string_view> parts;
  for (size_t begin = 0; begin <= path.size();) {
    const size_t end = std::min(path.find('/', begin), path.size());
    if (const auto part = path.substr(begin, end - begin); !part.empty() && part != ".")
      parts.push_back(part);
    begin = end + 1;
  }
  const Node* at = tree.node(kRootIno);
  for (size_t i = 0; i < parts.size(); ++i) {
    const Node* next = parts[i] == ".." ? nullptr : tree.lookup(at->ino, parts[i]);
    // a name not there, or a file with more of the path after it
    if (next == nullptr || (!next->is_dir && i + 1 < parts.size()))
      return {nullptr, at, std::string(parts[i])};
    at = next;
  }
  return {at, nullptr, {}};
}

std::vector<std::string> closest_names(const VirtualTree& tree, const Node& dir, std::string_view name,
                                       size_t limit) {
  std::vector<std::pair<size_t, std::string>> ranked;
  for (const auto& [child, ino] : dir.children) {
    const Node* n = tree.node(ino);
    ranked.emplace_back(edit_distance(name, child), n != nullptr && n->is_dir ? child + "/" : child);
  }
  if (!name.empty())
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < ranked.size() && i < limit; ++i) out.push_back(std::move(ranked[i].second));
  return out;
}

}  // namespace ckptfs::vfs
