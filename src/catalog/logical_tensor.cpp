#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <unordered_set>
#include <variant>

#include "catalog/dtype_convert.hpp"
#include "ckptfs/catalog.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/overloaded.hpp"

namespace ckptfs::catalog {

uint64_t LogicalTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

pickle::ValuePtr tensor_value(TensorRef tensor, bool requires_grad,
                              std::optional<std::vector<int64_t>> shape) {
  auto native = std::make_shared<TensorValue>();
  native->shape = shape ? std::move(*shape) : tensor->shape;
  native->tensor = std::move(tensor);
  native->requires_grad = requires_grad;
  auto v = pickle::make_value(pickle::Kind::Native);
  v->native = std::shared_ptr<const TensorValue>(std::move(native));
  return v;
}

const TensorValue* as_tensor_value(const pickle::Value& value) {
  if (!value.native) return nullptr;
  return std::visit(
      Overloaded{
          [](const std::shared_ptr<const torch::StorageRef>&) -> const TensorValue* { return nullptr; },
          [](const std::shared_ptr<const torch::TensorObject>&) -> const TensorValue* { return nullptr; },
          [](const std::shared_ptr<const TensorValue>& t) -> const TensorValue* { return t.get(); },
      },
      *value.native);
}

std::vector<io::FilePtr> LogicalTensor::files() const {
  std::vector<io::FilePtr> out;
  std::unordered_set<const io::File*> seen;  // a ZeRO-3 tensor has a run in every rank's file
  const auto add = [&](const io::FilePtr& f) {
    if (seen.insert(f.get()).second) out.push_back(f);
  };
  std::visit(Overloaded{
                 [&](const FlatRuns& flat) {
                   for (const Piece& p : flat.pieces) add(p.file);
                 },
                 [&](const Boxed& boxed) {
                   for (const Box& b : boxed.assembly->boxes()) {
                     if (!b.inner) {
                       add(b.source.storage.file);
                       continue;
                     }
                     for (const auto& f : b.inner->files()) add(f);
                   }
                 },
                 [&](const Transposed& transposed) {
                   for (const auto& f : transposed.of->files()) add(f);
                 },
             },
             source);
  return out;
}

uint64_t Catalog::total_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();
  return total;
}

namespace {

[[noreturn]] void fail(const LogicalTensor& tensor, const std::string& what) {
  throw FormatError(fmt::format("tensor {}: {}", tensor.name, what));
}

void check_conversion(const LogicalTensor& tensor, const Piece& run) {
  if (!conversion_supported(run.src_dtype, tensor.dtype))
    fail(tensor, fmt::format("{} holds it as {}, which cannot be served as {}", run.file->path().string(),
                             dtype_torch_name(run.src_dtype), dtype_torch_name(tensor.dtype)));
}

void validate_flat(const LogicalTensor& tensor, const FlatRuns& flat) {
  const uint64_t numel = tensor.numel();
  uint64_t next = 0;
  for (const Piece& p : flat.pieces) {
    if (p.dst_begin != next)
      fail(tensor,
           fmt::format("elements [{}, {}) are {}", std::min(next, p.dst_begin), std::max(next, p.dst_begin),
                       p.dst_begin > next ? "not covered by any source" : "covered twice"));
    if (p.count == 0 || p.count > numel - next)
      fail(tensor, fmt::format("a source run of {} elements at element {} does not fit in {} elements",
                               p.count, p.dst_begin, numel));
    next += p.count;
    if (!p.file) fail(tensor, "a source run has no file");
    check_conversion(tensor, p);
    const uint64_t size = dtype_size(p.src_dtype);
    if (p.src_offset > p.file->size() || p.count > (p.file->size() - p.src_offset) / size)
      fail(tensor, fmt::format("{}: {} bytes at offset {} run past the end of the file ({} bytes)",
                               p.file->path().string(), p.count * size, p.src_offset, p.file->size()));
  }
  if (next != numel)
    fail(tensor, fmt::format("elements [{}, {}) are not covered by any source", next, numel));
}

// Whether the elements a box's source view names (offset, strides, sizes) are all among the inner
// tensor's `numel` (an index read back from disk could say otherwise: reads would then fall short).
bool view_inside(const torch::SourceTensor& view, uint64_t numel) {
  if (view.storage_offset < 0) return false;
  __int128 last = view.storage_offset;
  for (size_t d = 0; d < view.shape.size(); ++d) {
    if (view.shape[d] == 0) return true;  // no element at all
    if (view.strides[d] < 0) return false;
    last += static_cast<__int128>(view.shape[d] - 1) * view.strides[d];
  }
  return last < static_cast<__int128>(numel);
}

// The tiling was checked when the assembly was built and the sources were bounds-checked; what is left are
// the conversions and the inner tensors, whose runs must place elements, and which must hold the elements
// their boxes name.
void validate_boxed(const LogicalTensor& tensor, const Boxed& boxed) {
  if (!boxed.assembly) fail(tensor, "has no boxes");
  for (const Box& b : boxed.assembly->boxes()) {
    if (!b.inner) {
      if (!b.source.storage.file) fail(tensor, "a box has no file");
      check_conversion(tensor, {0, 0, b.source.storage.file, 0, b.source.dtype});
      continue;
    }
    if (!runs_place_elements(*b.inner))
      fail(tensor,
           fmt::format("a box views the transposed tensor {}, whose runs place no elements", b.inner->name));
    if (b.source.strides.size() != b.source.shape.size() || !view_inside(b.source, b.inner->numel()))
      fail(tensor, fmt::format("a box names elements outside its inner tensor {} ({} elements)",
                               b.inner->name, b.inner->numel()));
    std::vector<Piece> runs;
    append_runs(*b.inner, 0, b.inner->numel(), runs);
    for (const Piece& r : runs) check_conversion(tensor, r);
  }
}

void validate_transposed(const LogicalTensor& tensor, const Transposed& transposed) {
  // The source was validated when it was built.
  if (!transposed.of) fail(tensor, "has no source tensor");
  if (!transposed.tiles) fail(tensor, "has no tile cache");
  const auto& src = transposed.of->shape;
  if (tensor.shape.size() != 2 || src.size() != 2 || tensor.shape[0] != src[1] || tensor.shape[1] != src[0] ||
      tensor.dtype != transposed.of->dtype)
    fail(tensor, "is not the transpose of its source tensor");
  if (const uint64_t size = dtype_size(tensor.dtype); size != 1 && size != 2 && size != 4 && size != 8)
    fail(tensor, fmt::format("has {}-byte elements, which a transposed tensor cannot be served in", size));
}

}  // namespace

void validate(const LogicalTensor& tensor) {
  for (int64_t d : tensor.shape)
    if (d < 0) fail(tensor, fmt::format("negative dimension in shape [{}]", fmt::join(tensor.shape, ", ")));
  std::visit(Overloaded{
                 [&](const FlatRuns& flat) { validate_flat(tensor, flat); },
                 [&](const Boxed& boxed) { validate_boxed(tensor, boxed); },
                 [&](const Transposed& transposed) { validate_transposed(tensor, transposed); },
             },
             tensor.source);
}

}  // namespace ckptfs::catalog
