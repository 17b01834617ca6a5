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

uint64_t shallow_weight(const Value& v, const NativeWeight& native_weight) {
  const uint64_t text = v.text.size() + v.module.size() + v.name.size() + v.member.size();
  const uint64_t native = !v.native ? 0 : native_weight ? native_weight(*v.native) : 1;
  return 1 + v.items.size() + v.entries.size() + text / 8 + native;
}

std::optional<std::string> check_structure(const Value& root, size_t max_depth, uint64_t max_weight,
                                           const NativeWeight& native_weight,
                                           std::unordered_set<const Value*>* containers) {
  const auto too_big = [&] {
    return fmt::format("the value expands to more than {} units (shared references repeated)", max_weight);
  };
  if (!has_children(root))
    return shallow_weight(root, native_weight) > max_weight ? std::optional(too_big()) : std::nullopt;
  constexpr size_t kInProgress = std::numeric_limits<size_t>::max();
  const auto too_deep = [&] { return fmt::format("containers nested deeper than {} levels", max_depth); };
  if (max_depth == 0) return too_deep();
  struct Frame {
    const Value* value;
    size_t next_child = 0;
    size_t height = 1;    // containers: 1 + the tallest child seen so far
    uint64_t weight = 0;  // its own and its children's so far, shared ones counted each time
  };
  struct Done {
    size_t height;  // kInProgress while on the path
    uint64_t weight;
  };
  // Weights never exceed max_weight before the check below returns, so sums of two cannot overflow
  // (max_weight is far below 2^63).
  std::unordered_map<const Value*, Done> done;
  std::vector<Frame> path{{&root, 0, 1, shallow_weight(root, native_weight)}};
  done[&root] = {kInProgress, 0};
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.weight > max_weight) return too_big();
    if (frame.next_child == child_count(*frame.value)) {
      const Done finished{frame.height, frame.weight};
      done[frame.value] = finished;
      path.pop_back();
      if (!path.empty()) {
        path.back().height = std::max(path.back().height, finished.height + 1);
        path.back().weight += finished.weight;
      }
      continue;
    }
    const Value* c = child(*frame.value, frame.next_child++);
    if (c == nullptr) continue;
    if (!has_children(*c)) {
      frame.weight += shallow_weight(*c, native_weight);
      continue;
    }
    auto [it, inserted] = done.try_emplace(c, Done{kInProgress, 0});
    if (!inserted) {
      if (it->second.height == kInProgress) return "the value contains itself (recursive structure)";
      // A shared subtree seen before: its height and weight are known.
      if (path.size() + it->second.height > max_depth) return too_deep();
      frame.height = std::max(frame.height, it->second.height + 1);
      frame.weight += it->second.weight;
      continue;
    }
    if (path.size() >= max_depth) return too_deep();
    path.push_back({c, 0, 1, shallow_weight(*c, native_weight)});
  }
  if (containers)
    for (const auto& [value, info] : done) containers->insert(value);
  return std::nullopt;
}

}  // namespace ckptfs::pickle
