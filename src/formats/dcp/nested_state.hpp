// The nested state dict DCP flattened, rebuilt from each item's planner path the way
// torch.distributed.checkpoint unflattens it (dicts for str keys, lists for int keys, items in metadata
// order), so that full_state.pt is the object dcp_to_torch_save writes.
#pragma once

#include <unordered_map>
#include <vector>

#include "ckptfs/pickle.hpp"

namespace ckptfs::dcp {

class NestedState {
 public:
  NestedState();
  // Puts `value` at `path` (str and int keys), creating the containers on the way. An empty path or one
  // that crosses a value already set throws FormatError (the caller names the item).
  void set(const std::vector<pickle::ValuePtr>& path, pickle::ValuePtr value);
  const pickle::ValuePtr& root() const { return root_; }

 private:
  pickle::ValuePtr& slot(const pickle::ValuePtr& container, const pickle::Value& key);

  pickle::ValuePtr root_;
  // Entry positions of every dict built, by key (str keys as text, int keys as "#<n>").
  std::unordered_map<const pickle::Value*, std::unordered_map<std::string, size_t>> index_;
};

}  // namespace ckptfs::dcp
