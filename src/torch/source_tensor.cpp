#include <memory>
#include <variant>

#include "ckptfs/overloaded.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::torch {

uint64_t SourceTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // bounded when the tensor was read
  return n;
}

bool SourceTensor::is_contiguous() const {
  if (numel() == 0) return true;
  uint64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (i >= strides.size() || static_cast<uint64_t>(strides[i]) != expected) return false;
    expected *= static_cast<uint64_t>(shape[i]);
  }
  return true;
}

const SourceTensor* as_tensor(const pickle::Value& value) {
  if (!value.native) return nullptr;
  return std::visit(
      Overloaded{
          [](const std::shared_ptr<const StorageRef>&) -> const SourceTensor* { return nullptr; },
          [](const std::shared_ptr<const TensorObject>& t) -> const SourceTensor* { return &t->tensor; },
          [](const std::shared_ptr<const catalog::TensorValue>&) -> const SourceTensor* { return nullptr; },
      },
      *value.native);
}

const SourceTensor* as_tensor(const pickle::Value* value) {
  return value ? as_tensor(*value) : nullptr;
}

}  // namespace ckptfs::torch
