#include "formats/value_tensors.hpp"

#include <fmt/format.h>

#include <unordered_map>

#include "ckptfs/torch.hpp"

namespace ckptfs::formats {

namespace {

using pickle::Value;
using pickle::ValuePtr;

// Two passes: the catalog grows first, then the values refer to its entries.
class TensorRebinder {
 public:
  TensorRebinder(std::shared_ptr<catalog::Catalog> tensors, std::string label)
      : catalog_(std::move(tensors)), tensors_(*catalog_), label_(std::move(label)) {}

  // Pass 1: every distinct tensor, in pickling order, becomes a catalog entry.
  void collect(const ValuePtr& v) {
    if (!v || !seen_.insert({v.get(), nullptr}).second) return;
    if (const auto* t = torch::as_tensor(v.get())) {
      tensor_index_[v.get()] = tensors_.tensors.size();
      tensors_.tensors.push_back(catalog::whole_tensor(fmt::format("{}[{}]", label_, tensors_.tensors.size()),
                                                       *t, t->dtype, label_));
      return;
    }
    for (const auto& item : v->items) collect(item);
    for (const auto& [k, val] : v->entries) {
      collect(k);
      collect(val);
    }
    collect(v->args);
    collect(v->state);
  }

  // Pass 2 (after collect).
  ValuePtr rebind(const ValuePtr& v) {
    if (!v) return v;
    if (auto it = done_.find(v.get()); it != done_.end()) return it->second;
    ValuePtr out = v;
    if (auto it = tensor_index_.find(v.get()); it != tensor_index_.end()) {
      out = catalog::tensor_value({catalog_, it->second}, torch::as_tensor(v.get())->requires_grad);
    } else {
      auto copy = std::make_shared<Value>(*v);
      bool changed = false;
      const auto swap = [&](ValuePtr& child) {
        ValuePtr rebound = rebind(child);
        changed = changed || rebound != child;
        child = std::move(rebound);
      };
      for (auto& item : copy->items) swap(item);
      for (auto& [k, val] : copy->entries) swap(val);
      swap(copy->args);
      swap(copy->state);
      if (changed) out = std::move(copy);
    }
    done_.emplace(v.get(), out);
    return out;
  }

 private:
  std::shared_ptr<catalog::Catalog> catalog_;
  catalog::Catalog& tensors_;
  std::string label_;
  std::unordered_map<const Value*, ValuePtr> seen_, done_;
  std::unordered_map<const Value*, size_t> tensor_index_;
};

}  // namespace

pickle::ValuePtr with_logical_tensors(const pickle::ValuePtr& root, std::shared_ptr<catalog::Catalog> tensors,
                                      const std::string& label) {
  TensorRebinder rebinder(std::move(tensors), label);
  rebinder.collect(root);
  return rebinder.rebind(root);
}

}  // namespace ckptfs::formats
