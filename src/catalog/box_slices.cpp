#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "catalog/transposed_reader.hpp"
#include "ckptfs/catalog.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::catalog {

torch::SourceTensor element_view(const LogicalTensor& tensor) {
  torch::SourceTensor out;
  out.dtype = tensor.dtype;
  out.shape = tensor.shape;
  out.strides.assign(tensor.shape.size(), 1);
  for (size_t d = tensor.shape.size(); d-- > 1;) out.strides[d - 1] = out.strides[d] * tensor.shape[d];
  out.storage.nbytes = tensor.nbytes();
  return out;
}

namespace {

void append_flat_runs(const FlatRuns& flat, uint64_t first, uint64_t count, std::vector<Piece>& out) {
  const uint64_t end = first + count;
  auto it = std::upper_bound(flat.pieces.begin(), flat.pieces.end(), first,
                             [](uint64_t e, const Piece& p) { return e < p.dst_begin; });
  if (it != flat.pieces.begin()) --it;
  for (; it != flat.pieces.end() && it->dst_begin < end; ++it) {
    const uint64_t lo = std::max(first, it->dst_begin), hi = std::min(end, it->dst_begin + it->count);
    if (lo >= hi) continue;
    out.push_back({lo, hi - lo, it->file, it->src_offset + (lo - it->dst_begin) * dtype_size(it->src_dtype),
                   it->src_dtype});
  }
}

}  // namespace

void append_runs(const LogicalTensor& tensor, uint64_t first, uint64_t count, std::vector<Piece>& out) {
  std::visit(Overloaded{
                 [&](const FlatRuns& flat) { append_flat_runs(flat, first, count, out); },
                 [&](const Boxed& boxed) { boxed.assembly->plan(first, count, out); },
                 [&](const Transposed& transposed) {
                   append_transposed_runs(tensor, transposed, first, count, out);
                 },
             },
             tensor.source);
}

bool runs_place_elements(const LogicalTensor& tensor) {
  return std::visit(Overloaded{
                        [](const FlatRuns&) { return true; },
                        [](const Boxed&) { return true; },
                        [](const Transposed&) { return false; },
                    },
                    tensor.source);
}

void build_ahead(const LogicalTensor& tensor, uint64_t first, uint64_t count) {
  std::visit(
      Overloaded{
          [](const FlatRuns&) {},  // bytes as they are: nothing to build
          [](const Boxed&) {},
          [&](const Transposed& transposed) { build_transposed_ahead(tensor, transposed, first, count); },
      },
      tensor.source);
}

torch::SourceTensor narrow(const torch::SourceTensor& src, size_t dim, int64_t start, int64_t length) {
  if (dim >= src.shape.size() || start < 0 || length < 0 || start > src.shape[dim] ||
      length > src.shape[dim] - start)
    throw std::logic_error(
        fmt::format("narrow of dimension {} to [{}, +{}) outside the tensor", dim, start, length));
  torch::SourceTensor out = src;
  out.storage_offset += start * src.strides[dim];
  out.shape[dim] = length;
  return out;
}

void append_slice(std::vector<Box>& out, const LogicalTensor& tensor, size_t dim, int64_t begin, int64_t end,
                  int64_t dst_begin) {
  const auto* boxed = std::get_if<Boxed>(&tensor.source);
  if (!boxed) throw std::logic_error("append_slice of tensor " + tensor.name + ", which has no boxes");
  for (const Box& b : boxed->assembly->boxes()) {
    const int64_t lo = std::max(begin, b.offsets[dim]);
    const int64_t hi = std::min(end, b.offsets[dim] + b.sizes[dim]);
    if (lo >= hi) continue;
    Box cut = b;
    cut.source = narrow(b.source, dim, lo - b.offsets[dim], hi - lo);
    cut.offsets[dim] = dst_begin + (lo - begin);
    cut.sizes[dim] = hi - lo;
    out.push_back(std::move(cut));
  }
}

LogicalTensor transposed_tensor(std::string name, const LogicalTensor& tensor,
                                std::shared_ptr<TransposeCache> tiles) {
  if (tensor.shape.size() != 2)
    throw std::logic_error("transpose of tensor " + tensor.name + ", which is not 2-D");
  LogicalTensor t;
  t.name = std::move(name);
  t.dtype = tensor.dtype;
  t.shape = {tensor.shape[1], tensor.shape[0]};
  t.origin = tensor.origin + ", transposed";
  t.source = Transposed{std::make_shared<LogicalTensor>(tensor), std::move(tiles)};
  return t;
}

LogicalTensor assembled_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                               std::vector<Box> boxes, std::string origin) {
  LogicalTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.origin = std::move(origin);
  t.source = Boxed{std::make_shared<BoxAssembly>(t.name, t.shape, std::move(boxes))};
  validate(t);
  return t;
}

}  // namespace ckptfs::catalog
