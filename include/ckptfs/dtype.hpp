// Element types of tensors, with their names in torch, torch storages and safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ckptfs {

enum class DType : uint8_t {
  F64,
  F32,
  F16,
  BF16,
  F8_E5M2,
  F8_E4M3FN,
  F8_E5M2FNUZ,
  F8_E4M3FNUZ,
  I64,
  I32,
  I16,
  I8,
  U8,
  U16,
  U32,
  U64,
  Bool,
  C64,
  C128,
};
// The table of the dtypes' facts (src/torch/dtype.cpp) has this many rows, one per enumerator in order:
// it does not compile with another number; the index codec bounds a decoded dtype by it.
inline constexpr size_t kDTypeCount = 19;

size_t dtype_size(DType d);
bool dtype_is_floating(DType d);
std::string_view dtype_torch_name(DType d);        // "float32", "bfloat16", "int64", ...
std::string_view dtype_safetensors_name(DType d);  // "F32", "BF16", "I64", ...
// Legacy storage class ("FloatStorage"); empty for dtypes torch saves as UntypedStorage + _rebuild_tensor_v3.
std::string_view dtype_storage_class(DType d);
std::optional<DType> dtype_from_storage_class(std::string_view class_name);
std::optional<DType> dtype_from_torch_name(std::string_view name);
// Position in the safetensors reference writer's dtype order (larger = written first).
int dtype_safetensors_rank(DType d);

}  // namespace ckptfs
