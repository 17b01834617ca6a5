#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_set>

#include "catalog/dtype_convert.hpp"
#include "ckptfs/catalog.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::catalog {

uint64_t LogicalTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

pickle::ValuePtr tensor_value(const LogicalTensor& tensor, bool requires_grad,
                              std::optional<std::vector<int64_t>> shape) {
  auto native = std::make_shared<TensorValue>();
  native->tensor = &tensor;
  native->shape = shape ? std::move(*shape) : tensor.shape;
  native->requires_grad = requires_grad;
  auto v = pickle::make_value(pickle::Kind::Native);
  v->native = std::move(native);
  return v;
}

std::vector<io::FilePtr> LogicalTensor::files() const {
  std::vector<io::FilePtr> out;
  std::unordered_set<const io::File*> seen;  // a ZeRO-3 tensor has a run in every rank's file
  const auto add = [&](const io::FilePtr& f) {
    if (seen.insert(f.get()).second) out.push_back(f);
  };
  for (const Piece& p : pieces) add(p.file);
  if (transpose_of)
    for (const auto& f : transpose_of->files()) add(f);
  if (boxes)
    for (const Box& b : boxes->boxes()) {
      if (!b.inner) {
        add(b.source.storage.file);
        continue;
      }
      for (const auto& f : b.inner->files()) add(f);
    }
  return out;
}

uint64_t Catalog::total_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();
  return total;
}

void validate(const LogicalTensor& tensor) {
  const auto fail = [&](const std::string& what) {
    throw FormatError(fmt::format("tensor {}: {}", tensor.name, what));
  };
  for (int64_t d : tensor.shape)
    if (d < 0) fail(fmt::format("negative dimension in shape [{}]", fmt::join(tensor.shape, ", ")));
  const uint64_t numel = tensor.numel();
  if (tensor.transpose_of) {  // the source was validated when it was built
    const auto& src = tensor.transpose_of->shape;
    if (tensor.shape.size() != 2 || src.size() != 2 || tensor.shape[0] != src[1] || tensor.shape[1] != src[0] ||
        !tensor.pieces.empty() || tensor.boxes || tensor.dtype != tensor.transpose_of->dtype)
      fail("is not the transpose of its source tensor");
    return;
  }
  if (tensor.boxes) {  // the tiling was checked when the assembly was built; sources were bounds-checked
    if (!tensor.pieces.empty()) fail("has both flat runs and boxes");
    for (const Box& b : tensor.boxes->boxes()) {
      std::vector<Piece> runs;  // an inner tensor's sources, else the box's own
      if (b.inner)
        append_runs(*b.inner, 0, b.inner->numel(), runs);
      else
        runs.push_back({0, 0, b.source.storage.file, 0, b.source.dtype});
      for (const Piece& r : runs)
        if (!conversion_supported(r.src_dtype, tensor.dtype))
          fail(fmt::format("{} holds it as {}, which cannot be served as {}", r.file->path().string(),
                           dtype_torch_name(r.src_dtype), dtype_torch_name(tensor.dtype)));
    }
    return;
  }
  uint64_t next = 0;
  for (const Piece& p : tensor.pieces) {
    if (p.dst_begin != next)
      fail(fmt::format("elements [{}, {}) are {}", std::min(next, p.dst_begin), std::max(next, p.dst_begin),
                       p.dst_begin > next ? "not covered by any source" : "covered twice"));
    if (p.count == 0 || p.count > numel - next)
      fail(fmt::format("a source run of {} elements at element {} does not fit in {} elements", p.count,
                       p.dst_begin, numel));
    next += p.count;
    if (!p.file) fail("a source run has no file");
    if (!conversion_supported(p.src_dtype, tensor.dtype))
      fail(fmt::format("{} holds it as {}, which cannot be served as {}", p.file->path().string(),
                       dtype_torch_name(p.src_dtype), dtype_torch_name(tensor.dtype)));
    const uint64_t size = dtype_size(p.src_dtype);
    if (p.src_offset > p.file->size() || p.count > (p.file->size() - p.src_offset) / size)
      fail(fmt::format("{}: {} bytes at offset {} run past the end of the file ({} bytes)",
                       p.file->path().string(), p.count * size, p.src_offset, p.file->size()));
  }
  if (next != numel) fail(fmt::format("elements [{}, {}) are not covered by any source", next, numel));
}

}  // namespace ckptfs::catalog
