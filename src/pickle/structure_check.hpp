// Checks that an unpickled value is a tree (shared subtrees allowed) of bounded depth, so that consumers
// can walk it recursively.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "ckptfs/pickle.hpp"

namespace ckptfs::pickle {

// The problem (a cycle, or nesting deeper than max_depth containers), or nullopt. Iterative; its own
// stack never exceeds max_depth frames.
std::optional<std::string> check_structure(const Value& root, size_t max_depth);

}  // namespace ckptfs::pickle
