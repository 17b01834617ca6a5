#include "formats/dtensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckptfs/error.hpp"

namespace ckptfs::formats {

using pickle::Kind;
using pickle::Value;

namespace {

bool is_dtensor_class(const Value& v) {
  // torch.distributed.tensor since 2.5, torch.distributed._tensor(.api) before
  return (v.kind == Kind::Global || v.kind == Kind::Object) && v.name == "DTensor" &&
         v.module.starts_with("torch.distributed");
}

Field child(const Field& parent, const Value* value, std::string_view what) {
  return Field(value, parent.file(), fmt::format("{}.{}", parent.path(), what));
}

// The BUILD state or the constructor arguments of an object, as a field named `what`.
Field args_of(const Field& obj) {
  const Value& v = obj.value();
  return child(obj, v.args.get(), "<args>");
}

// A _FlatLayout's or _MeshLayout's shape entry: an int or a (nested) tuple of ints; its size is their
// product (a flattened mesh dimension keeps the sizes it was flattened from).
int64_t layout_size(const Field& f) {
  const Value& v = f.value();
  if (v.kind == Kind::Int) return v.integer;
  if (v.kind != Kind::Tuple && v.kind != Kind::List)
    f.fail(fmt::format("expected a mesh size, found {}", v.describe()));
  int64_t n = 1;
  for (size_t i = 0; i < v.items.size(); ++i) n *= layout_size(f.at(i));
  return n;
}

// The mesh's shape: torch 2.14 keeps a _MeshLayout whose `axes` are one _FlatLayout per mesh dimension;
// versions between a _MeshLayout with the shape itself; torch 2.6 (and older) the `mesh` tensor of ranks.
std::vector<int64_t> mesh_shape_of(const Field& mesh) {
  std::vector<int64_t> shape;
  if (const Field layout = mesh["_layout"]; layout.present()) {
    if (const Field axes = layout["axes"]; axes.present()) {
      for (size_t i = 0; i < axes.size(); ++i) shape.push_back(layout_size(axes.at(i)["shape"]));
      return shape;
    }
    const Field s = layout["shape"];
    if (s.value().kind == Kind::Int) return {s.value().integer};
    for (size_t i = 0; i < s.size(); ++i) shape.push_back(layout_size(s.at(i)));
    return shape;
  }
  for (const char* key : {"mesh", "_mesh"})
    if (const Field m = mesh[key]; m.present()) return m.as_tensor().shape;
  mesh.fail("a DeviceMesh with neither _layout nor mesh: cannot tell its shape");
}

Placement placement_of(const Field& f) {
  const Value& v = f.value();
  if (v.kind != Kind::Object || !v.module.starts_with("torch.distributed"))
    f.fail(fmt::format("expected a placement, found {}", v.describe()));
  if (v.name == "Replicate") return {true, 0};
  if (v.name == "Shard") {
    if (const Field dim = f["dim"]; dim.present()) return {false, dim.as_int()};
    return {false, args_of(f).at(0).as_int()};  // Shard(dim) pickled by its constructor
  }
  throw UnsupportedError(fmt::format("{}: {}: placement {} is not supported (only Shard and Replicate)",
                                     f.file()->string(), f.path(), v.name));
}

}  // namespace

std::optional<DTensorShard> as_dtensor(const Field& field) {
  const Value& v = field.value();
  if (v.kind != Kind::Object || !v.is_global("torch._tensor", "_rebuild_from_type_v2") || !v.args ||
      v.args->items.size() != 4 || !is_dtensor_class(*v.args->items[1]))
    return std::nullopt;
  const Field call = args_of(field);
  const Field state = call.at(3);  // (None, {'_local_tensor': ..., '_spec': ...}): (dict, slots) of DTensor
  const Field attrs = state.is_list() ? state.at(1) : state;
  DTensorShard out;
  out.local = attrs["_local_tensor"].as_tensor();
  const Field spec = attrs["_spec"];
  const Field mesh = spec["mesh"];
  out.mesh_shape = mesh_shape_of(mesh);
  for (const auto n : out.mesh_shape)
    if (n < 1) mesh.fail(fmt::format("mesh dimension of size {}", n));
  // _mesh_dim_names since torch 2.9, mesh_dim_names before
  for (const char* key : {"_mesh_dim_names", "mesh_dim_names"})
    if (const Field names = mesh[key]; names.present() && out.mesh_dim_names.empty())
      for (size_t i = 0; i < names.size(); ++i) out.mesh_dim_names.push_back(names.at(i).as_string());
  if (const Field coord = mesh["_coordinate_on_dim"]; coord.present()) out.coordinate = coord.as_shape();
  const Field placements = spec["placements"];
  for (size_t i = 0; i < placements.size(); ++i) out.placements.push_back(placement_of(placements.at(i)));
  // TensorMeta(shape, stride, dtype), a NamedTuple pickled with its fields as constructor arguments
  const Field meta = spec["tensor_meta"];
  out.global_shape = (meta.value().args ? args_of(meta).at(0) : meta["shape"]).as_shape();
  // _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
  const auto size = call.at(2).at(2).as_shape();
  if (size != out.global_shape) field.fail("DTensor size and its spec's tensor_meta shape differ");
  for (const auto n : out.global_shape)  // keeps the chunk arithmetic of local_box far from overflow
    if (n > (int64_t{1} << 40)) field.fail(fmt::format("DTensor dimension of {} elements", n));
  if (out.placements.size() != out.mesh_shape.size())
    field.fail(fmt::format("{} placements for a {}-D mesh", out.placements.size(), out.mesh_shape.size()));
  for (const auto& p : out.placements)
    if (!p.replicate && (p.dim < 0 || p.dim >= static_cast<int64_t>(out.global_shape.size())))
      field.fail(fmt::format("Shard({}) of a {}-D tensor", p.dim, out.global_shape.size()));
  if (out.coordinate && out.coordinate->size() != out.mesh_shape.size())
    field.fail("mesh coordinate and mesh shape differ in length");
  if (out.local.shape.size() != out.global_shape.size())
    field.fail(fmt::format("local tensor of {} dims for a {}-D DTensor", out.local.shape.size(),
                           out.global_shape.size()));
  if (const Value& dtype = call.at(2).at(1).value(); dtype.kind == Kind::Global && dtype.module == "torch")
    if (dtype_from_torch_name(dtype.name) != out.local.dtype)
      field.fail(fmt::format("DTensor of torch.{} holds a local tensor of {}", dtype.name,
                             dtype_torch_name(out.local.dtype)));
  return out;
}

std::string placement_string(const std::vector<Placement>& placements) {
  std::vector<std::string> out;
  for (const auto& p : placements)
    out.push_back(p.replicate ? std::string("R") : fmt::format("S({})", p.dim));
  return fmt::format("{}", fmt::join(out, ","));
}

std::string mesh_string(const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  std::vector<std::string> dims;
  for (size_t i = 0; i < shape.size(); ++i)
    dims.push_back(i < names.size() ? fmt::format("{}={}", names[i], shape[i]) : std::to_string(shape[i]));
  return fmt::format("{}", fmt::join(dims, " x "));
}

int64_t mesh_ranks(const std::vector<int64_t>& shape, int64_t cap) {
  int64_t n = 1;
  for (const auto m : shape) n = m > cap ? cap + 1 : std::min(n * m, cap + 1);
  return n;
}

std::vector<int64_t> mesh_coordinate(int64_t rank, const std::vector<int64_t>& mesh_shape) {
  std::vector<int64_t> c(mesh_shape.size());
  for (size_t i = mesh_shape.size(); i-- > 0;) {
    c[i] = rank % mesh_shape[i];
    rank /= mesh_shape[i];
  }
  return c;
}

LocalBox local_box(const std::vector<int64_t>& global_shape, const std::vector<Placement>& placements,
                   const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coordinate) {
  LocalBox box{std::vector<int64_t>(global_shape.size(), 0), global_shape};
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].replicate) continue;
    const auto d = static_cast<size_t>(placements[m].dim);
    const int64_t n = box.sizes[d], k = mesh_shape[m];
    const int64_t piece = (n + k - 1) / k;  // torch.chunk
    const int64_t begin = std::min(n, piece * coordinate[m]);
    box.offsets[d] += begin;
    box.sizes[d] = std::min(piece, n - begin);
  }
  return box;
}

}  // namespace ckptfs::formats
