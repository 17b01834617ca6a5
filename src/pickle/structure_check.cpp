#include "pickle/structure_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

namespace ckptfs::pickle {

namespace {

// Children in a fixed order: items, then entry keys and values, then args, state, kwargs.
size_t child_count(const Value& v) {
  return v.items.size() + 2 * v.entries.size() + 3;
}

const Value* child(const Value& v, size_t i) {
  if (i < v.items.size()) return v.items[i].get();
  i -= v.items.size();
  if (i < 2 * v.entries.size()) {
    const auto& [key, value] = v.entries[i / 2];
    return (i % 2 == 0 ? key : value).get();
  }
  i -= 2 * v.entries.size();
  return (i == 0 ? v.args : i == 1 ? v.state : v.kwargs).get();
}

bool has_children(const Value& v) {
  return !v.items.empty() || !v.entries.empty() || v.args || v.state || v.kwargs;
}

}  // namespace

std::optional<std::string> check_structure(const Value& root, size_t max_depth) {
  if (!has_children(root)) return std::nullopt;
  constexpr size_t kInProgress = std::numeric_limits<size_t>::max();
  const auto too_deep = [&] { return fmt::format("containers nested deeper than {} levels", max_depth); };
  if (max_depth == 0) return too_deep();
  struct Frame {
    const Value* value;
    size_t next_child = 0;
    size_t height = 1;  // containers: 1 + the tallest child seen so far
  };
  std::unordered_map<const Value*, size_t> heights;  // finished containers; kInProgress while on the path
  std::vector<Frame> path{{&root}};
  heights[&root] = kInProgress;
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.next_child == child_count(*frame.value)) {
      const size_t height = frame.height;
      heights[frame.value] = height;
      path.pop_back();
      if (!path.empty()) path.back().height = std::max(path.back().height, height + 1);
      continue;
    }
    const Value* c = child(*frame.value, frame.next_child++);
    if (c == nullptr || !has_children(*c)) continue;
    auto [it, inserted] = heights.try_emplace(c, kInProgress);
    if (!inserted) {
      if (it->second == kInProgress) return "the value contains itself (recursive structure)";
      // A shared subtree seen before: its height is known.
      if (path.size() + it->second > max_depth) return too_deep();
      frame.height = std::max(frame.height, it->second + 1);
      continue;
    }
    if (path.size() >= max_depth) return too_deep();
    path.push_back({c});
  }
  return std::nullopt;
}

}  // namespace ckptfs::pickle
