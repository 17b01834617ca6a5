#include "torch/tensor_builder.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <memory>
#include <variant>

#include "ckptfs/error.hpp"
#include "ckptfs/overloaded.hpp"

namespace ckptfs::torch {

namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

const Value& arg(std::string_view fn, const std::vector<ValuePtr>& a, size_t i, Kind kind,
                 std::string_view what) {
  if (a[i]->kind != kind)
    throw FormatError(fmt::format("{}: argument {} is a {}, expected {}", fn, i + 1, a[i]->describe(), what));
  return *a[i];
}

int64_t non_negative(std::string_view fn, const Value& v, std::string_view what) {
  if (v.kind != Kind::Int || v.integer < 0)
    throw FormatError(fmt::format("{}: {} must be a non-negative int, found {}", fn, what,
                                  v.kind == Kind::Int ? std::to_string(v.integer) : v.describe()));
  return v.integer;
}

std::vector<int64_t> int_tuple(std::string_view fn, const Value& v, std::string_view what) {
  if (v.kind != Kind::Tuple && v.kind != Kind::List)
    throw FormatError(fmt::format("{}: {} is a {}, expected a tuple", fn, what, v.describe()));
  std::vector<int64_t> out;
  out.reserve(v.items.size());
  for (const auto& item : v.items) out.push_back(non_negative(fn, *item, what));
  return out;
}

// The view must fit its storage: with every index at its maximum, the element still lies inside.
void check_view(std::string_view fn, const SourceTensor& t, const StorageRef& storage) {
  if (t.shape.size() != t.strides.size())
    throw FormatError(fmt::format("{}: {} sizes but {} strides", fn, t.shape.size(), t.strides.size()));
  unsigned __int128 numel = 1;
  for (int64_t d : t.shape)
    numel = std::min<unsigned __int128>(numel * static_cast<uint64_t>(d), uint64_t{1} << 63);
  if (numel > kMaxInt64) throw FormatError(fmt::format("{}: the tensor has more than 2^63 elements", fn));
  if (numel == 0) return;
  const uint64_t capacity = storage.nbytes / dtype_size(t.dtype);  // whole elements in the storage
  // Each partial sum stays below 2^64 + 2^126, far inside 128 bits.
  unsigned __int128 last = static_cast<uint64_t>(t.storage_offset);
  for (size_t i = 0; i < t.shape.size() && last < capacity; ++i)
    last += static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<uint64_t>(t.strides[i]);
  if (last >= capacity)
    throw FormatError(
        fmt::format("{}: view (offset {}, shape [{}], strides [{}]) of {} elements reaches past storage "
                    "'{}' ({} bytes)",
                    fn, t.storage_offset, fmt::join(t.shape, ", "), fmt::join(t.strides, ", "),
                    dtype_torch_name(t.dtype), storage.key, storage.nbytes));
}

DType storage_dtype(const Value& type) {
  if (type.kind != Kind::Global || !type.name.ends_with("Storage"))
    throw FormatError(fmt::format("persistent id names {} as storage type", type.describe()));
  if (type.name == "UntypedStorage") return DType::U8;  // sized in bytes
  // The module is ignored, as torch does (torch.cuda.FloatStorage loads too).
  if (auto d = dtype_from_storage_class(type.name)) return *d;
  throw UnsupportedError(fmt::format("storage type {}.{} is not supported", type.module, type.name));
}

// The storage a value holds, or null.
std::shared_ptr<const StorageRef> as_storage(const Value& v) {
  if (!v.native) return nullptr;
  return std::visit(
      Overloaded{
          [](const std::shared_ptr<const StorageRef>& s) { return s; },
          [](const std::shared_ptr<const TensorObject>&) { return std::shared_ptr<const StorageRef>(); },
          [](const std::shared_ptr<const catalog::TensorValue>&) {
            return std::shared_ptr<const StorageRef>();
          },
      },
      *v.native);
}

// What a consumer copying the native copies besides itself: a tensor's shape and strides.
uint64_t native_weight(const pickle::Native& native) {
  return std::visit(Overloaded{
                        [](const std::shared_ptr<const StorageRef>&) -> uint64_t { return 1; },
                        [](const std::shared_ptr<const TensorObject>& t) -> uint64_t {
                          return 1 + t->tensor.shape.size() + t->tensor.strides.size();
                        },
                        [](const std::shared_ptr<const catalog::TensorValue>&) -> uint64_t { return 1; },
                    },
                    native);
}

}  // namespace

pickle::UnpickleOptions TensorBuilder::options() {
  pickle::UnpickleOptions o;
  o.persistent_load = [this](const ValuePtr& pid) { return persistent_load(pid); };
  o.reduce = [this](const Value& callable, const ValuePtr& args) { return reduce(callable, args); };
  o.native_weight = native_weight;
  return o;
}

ValuePtr TensorBuilder::persistent_load(const ValuePtr& pid) {
  const auto& a = pid->items;
  if (pid->kind != Kind::Tuple || a.empty() || a[0]->kind != Kind::String)
    throw FormatError(fmt::format("persistent id is a {}, not a ('storage', ...) tuple", pid->describe()));
  // Legacy files reference nn.Module classes as ('module', cls, source_file, source): torch returns cls.
  if (a[0]->text == "module" && a.size() == 4) return a[1];
  if (a[0]->text != "storage" || (a.size() != 5 && a.size() != 6))
    throw FormatError(fmt::format("unknown persistent id ('{}', ...) with {} items", a[0]->text, a.size()));
  constexpr std::string_view fn = "persistent id";
  const DType dtype = storage_dtype(*a[1]);
  const std::string& key = arg(fn, a, 2, Kind::String, "a storage key").text;
  const auto numel = static_cast<uint64_t>(non_negative(fn, *a[4], "storage size"));
  const size_t item = dtype_size(dtype);
  if (numel > kMaxInt64 / item)
    throw FormatError(fmt::format("storage '{}' of {} elements is too large", key, numel));
  const RootStorage root{dtype, numel, numel * item};
  auto [it, inserted] = storages_.try_emplace(key, root);
  if (!inserted && (it->second.dtype != dtype || it->second.numel != numel))
    throw FormatError(fmt::format("storage '{}' is referenced as {} x {} and as {} x {}", key,
                                  it->second.numel, dtype_torch_name(it->second.dtype), numel,
                                  dtype_torch_name(dtype)));

  // Legacy storage views: (view_key, offset, size) in elements of the root storage.
  uint64_t view_offset = 0, view_numel = numel;
  std::string ref_key = key;
  if (a.size() == 6 && a[5]->kind != Kind::None) {
    const auto& view = arg(fn, a, 5, Kind::Tuple, "a (key, offset, size) view").items;
    if (view.size() != 3 || view[0]->kind != Kind::String)
      throw FormatError(fmt::format("storage '{}': malformed view metadata", key));
    view_offset = static_cast<uint64_t>(non_negative(fn, *view[1], "view offset"));
    view_numel = static_cast<uint64_t>(non_negative(fn, *view[2], "view size"));
    if (view_offset > numel || view_numel > numel - view_offset)
      throw FormatError(
          fmt::format("storage view '{}' ({} elements at {}) exceeds storage '{}' ({} elements)",
                      view[0]->text, view_numel, view_offset, key, numel));
    ref_key = fmt::format("{}\n{}\n{}", key, view_offset, view_numel);
  }
  ValuePtr& ref = refs_[ref_key];
  if (!ref) {
    auto storage = std::make_shared<StorageRef>();
    storage->key = key;
    storage->dtype = dtype;
    storage->offset = view_offset * item;
    storage->nbytes = view_numel * item;
    ref = pickle::make_value(Kind::Native);
    ref->native = std::shared_ptr<const StorageRef>(std::move(storage));
  }
  return ref;
}

ValuePtr TensorBuilder::reduce(const Value& callable, const ValuePtr& args) {
  const auto& a = args->items;
  if (callable.module == "torch._utils") {
    if (callable.name == "_rebuild_tensor" || callable.name == "_rebuild_tensor_v2" ||
        callable.name == "_rebuild_tensor_v3")
      return rebuild_tensor(callable.name, a);
    if (callable.name == "_rebuild_parameter" || callable.name == "_rebuild_parameter_with_state")
      return rebuild_parameter(a);
  } else if (callable.module == "torch._tensor" && callable.name == "_rebuild_from_type_v2") {
    // (func, type, args, state): the tensor is func(*args); the subclass and its attributes are dropped.
    if (a.size() != 4 || a[0]->kind != Kind::Global || a[2]->kind != Kind::Tuple)
      throw FormatError("_rebuild_from_type_v2: expected (func, type, args, state)");
    if (a[0]->is_global("torch._tensor", "_rebuild_from_type_v2"))
      throw FormatError("_rebuild_from_type_v2: nested in itself");
    return reduce(*a[0], a[2]);
  } else if (callable.module == "torch" && callable.name == "Size") {
    if (a.size() == 1 && (a[0]->kind == Kind::Tuple || a[0]->kind == Kind::List)) {
      auto size = std::make_shared<Value>();
      size->kind = Kind::Tuple;
      size->items = a[0]->items;
      size->module = "torch";  // a tuple to readers; written back as torch.Size
      size->name = "Size";
      return size;
    }
  }
  return nullptr;
}

ValuePtr TensorBuilder::rebuild_tensor(std::string_view fn, const std::vector<ValuePtr>& a) {
  // _rebuild_tensor(storage, offset, size, stride)
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
  // _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
  const bool v1 = fn == "_rebuild_tensor", v3 = fn == "_rebuild_tensor_v3";
  const size_t required = v1 ? 4 : v3 ? 7 : 6;
  if (a.size() != required && (v1 || a.size() != required + 1))
    throw FormatError(fmt::format("{}: {} arguments", fn, a.size()));
  const Value& storage_value = arg(fn, a, 0, Kind::Native, "a storage");
  auto storage = as_storage(storage_value);
  if (!storage)
    throw FormatError(
        fmt::format("{}: argument 1 is a {}, expected a storage", fn, storage_value.describe()));
  SourceTensor t;
  t.dtype = storage->dtype;
  t.storage_offset = non_negative(fn, *a[1], "storage offset");
  t.shape = int_tuple(fn, *a[2], "size");
  t.strides = int_tuple(fn, *a[3], "stride");
  if (!v1) t.requires_grad = arg(fn, a, 4, Kind::Bool, "a bool").boolean;
  if (v3) {
    const Value& dtype = arg(fn, a, 6, Kind::Global, "a dtype");
    auto d = dtype.module == "torch" ? dtype_from_torch_name(dtype.name) : std::nullopt;
    if (!d) throw UnsupportedError(fmt::format("{}: tensor dtype {} is not supported", fn, dtype.describe()));
    t.dtype = *d;
  }
  if (a.size() == required + 1) {
    // Only the conj/neg bits are ever stored here; they change what the bytes mean.
    const Value& metadata = *a[required];
    if (metadata.kind == Kind::Dict && !metadata.entries.empty())
      throw UnsupportedError(fmt::format("{}: tensors with conj/neg bits are not supported", fn));
  }
  check_view(fn, t, *storage);
  return add_tensor(std::move(t), std::move(storage));
}

ValuePtr TensorBuilder::rebuild_parameter(const std::vector<ValuePtr>& a) {
  // (data, requires_grad, backward_hooks[, state]); a Parameter reads as its data tensor.
  if (a.size() < 3 || a.size() > 4)
    throw FormatError(fmt::format("_rebuild_parameter: {} arguments", a.size()));
  const SourceTensor* data = as_tensor(*a[0]);
  if (!data)
    throw FormatError(fmt::format("_rebuild_parameter: data is a {}, not a tensor", a[0]->describe()));
  SourceTensor t = *data;
  t.requires_grad = arg("_rebuild_parameter", a, 1, Kind::Bool, "a bool").boolean;
  auto storage = storage_of_.at(data);
  return add_tensor(std::move(t), std::move(storage));
}

ValuePtr TensorBuilder::add_tensor(SourceTensor tensor, std::shared_ptr<const StorageRef> storage) {
  auto object = std::make_shared<TensorObject>();
  object->tensor = std::move(tensor);
  storage_of_.emplace(&object->tensor, storage);
  tensors_.push_back({object, std::move(storage)});
  auto v = pickle::make_value(Kind::Native);
  v->native = std::shared_ptr<const TensorObject>(std::move(object));
  return v;
}

void TensorBuilder::resolve(
    const std::function<StorageSpan(const std::string& key, const RootStorage& root)>& locate) {
  std::map<std::string, StorageSpan> roots;
  for (const auto& [key, root] : storages_) roots.emplace(key, locate(key, root));
  for (auto& [tensor, storage] : tensors_) {
    const StorageSpan& root = roots.at(storage->key);
    tensor->tensor.storage = {root.file, root.offset + storage->offset, storage->nbytes};
  }
}

}  // namespace ckptfs::torch
