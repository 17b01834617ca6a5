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
  if (value.kind != pickle::Kind::Native) return nullptr;
  const auto* object = dynamic_cast<const TensorObject*>(value.native.get());
  return object ? &object->tensor : nullptr;
}

const SourceTensor* as_tensor(const pickle::Value* value) {
  return value ? as_tensor(*value) : nullptr;
}

}  // namespace ckptfs::torch
