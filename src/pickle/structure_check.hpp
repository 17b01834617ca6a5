// Checks that an unpickled value is a tree (shared subtrees allowed) of bounded depth and bounded expanded
// size, so that consumers can walk it recursively and copy what they walk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>

#include "ckptfs/pickle.hpp"

namespace ckptfs::pickle {

// What a native costs (UnpickleOptions::native_weight); null: 1.
using NativeWeight = std::function<uint64_t(const Native&)>;

// What copying `v` alone costs (not its children): 1, plus 1 per item or entry, plus its text / 8, plus
// its native's weight.
uint64_t shallow_weight(const Value& v, const NativeWeight& native_weight);

// The problem (a cycle, nesting deeper than max_depth containers, a weight over max_weight with every
// shared subtree counted at each place it appears), or nullopt. Iterative; its own stack never exceeds
// max_depth frames; each value is visited once.
// When the structure is fine and `containers` is given, it receives every value with children that is
// reachable from `root`.
std::optional<std::string> check_structure(const Value& root, size_t max_depth, uint64_t max_weight,
                                           const NativeWeight& native_weight,
                                           std::unordered_set<const Value*>* containers = nullptr);

}  // namespace ckptfs::pickle
