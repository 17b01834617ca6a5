#include "ckptfs/dtype.hpp"

#include <array>

namespace ckptfs {

namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  bool floating;
  std::string_view torch_name;
  std::string_view safetensors_name;
  std::string_view storage_class;
  int safetensors_rank;  // the reference writer's enum order
};

// clang-format off
constexpr std::array<DTypeInfo, kDTypeCount> kTable{{
    {DType::F64, 8, true, "float64", "F64", "DoubleStorage", 19},
    {DType::F32, 4, true, "float32", "F32", "FloatStorage", 17},
    {DType::F16, 2, true, "float16", "F16", "HalfStorage", 13},
    {DType::BF16, 2, true, "bfloat16", "BF16", "BFloat16Storage", 14},
    {DType::F8_E5M2, 1, true, "float8_e5m2", "F8_E5M2", "", 6},
    {DType::F8_E4M3FN, 1, true, "float8_e4m3fn", "F8_E4M3", "", 7},
    {DType::F8_E5M2FNUZ, 1, true, "float8_e5m2fnuz", "F8_E5M2FNUZ", "", 10},
    {DType::F8_E4M3FNUZ, 1, true, "float8_e4m3fnuz", "F8_E4M3FNUZ", "", 9},
    {DType::I64, 8, false, "int64", "I64", "LongStorage", 20},
    {DType::I32, 4, false, "int32", "I32", "IntStorage", 15},
    {DType::I16, 2, false, "int16", "I16", "ShortStorage", 11},
    {DType::I8, 1, false, "int8", "I8", "CharStorage", 5},
    {DType::U8, 1, false, "uint8", "U8", "ByteStorage", 4},
    {DType::U16, 2, false, "uint16", "U16", "", 12},
    {DType::U32, 4, false, "uint32", "U32", "", 16},
    {DType::U64, 8, false, "uint64", "U64", "", 21},
    {DType::Bool, 1, false, "bool", "BOOL", "BoolStorage", 0},
    {DType::C64, 8, true, "complex64", "C64", "ComplexFloatStorage", 18},
    {DType::C128, 16, true, "complex128", "C128", "ComplexDoubleStorage", 22},
}};
// clang-format on

const DTypeInfo& info(DType d) {
  return kTable[static_cast<size_t>(d)];
}

static_assert([] {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (static_cast<size_t>(kTable[i].dtype) != i) return false;
  return true;
}());

}  // namespace

size_t dtype_size(DType d) {
  return info(d).size;
}
bool dtype_is_floating(DType d) {
  return info(d).floating;
}
std::string_view dtype_torch_name(DType d) {
  return info(d).torch_name;
}
std::string_view dtype_safetensors_name(DType d) {
  return info(d).safetensors_name;
}
std::string_view dtype_storage_class(DType d) {
  return info(d).storage_class;
}
int dtype_safetensors_rank(DType d) {
  return info(d).safetensors_rank;
}

std::optional<DType> dtype_from_storage_class(std::string_view class_name) {
  for (const auto& i : kTable)
    if (!i.storage_class.empty() && i.storage_class == class_name) return i.dtype;
  return std::nullopt;
}

std::optional<DType> dtype_from_torch_name(std::string_view name) {
  for (const auto& i : kTable)
    if (i.torch_name == name) return i.dtype;
  // Aliases torch pickles for some dtypes.
  if (name == "float") return DType::F32;
  if (name == "half") return DType::F16;
  if (name == "double") return DType::F64;
  if (name == "long") return DType::I64;
  if (name == "int") return DType::I32;
  if (name == "short") return DType::I16;
  return std::nullopt;
}

}  // namespace ckptfs
