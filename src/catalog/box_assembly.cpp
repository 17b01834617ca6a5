#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <span>

#include "ckptfs/catalog.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::catalog {

namespace {

constexpr uint64_t kMaxCells = uint64_t{1} << 24;  // grid cells a tensor's boxes may cut it into

uint64_t volume(const std::vector<int64_t>& sizes) {
  uint64_t n = 1;
  for (int64_t d : sizes) n *= static_cast<uint64_t>(d);
  return n;
}

// First dimension of the trailing block that is contiguous in the logical tensor and in the source.
size_t contiguous_block_dim(const Box& box, const std::vector<int64_t>& shape) {
  const size_t dims = shape.size();
  size_t block = dims;
  int64_t inner = 1;  // source elements in the block so far
  for (size_t d = dims; d-- > 0;) {
    if (box.sizes[d] != 1 && box.source.strides[d] != inner) break;
    block = d;
    inner *= box.sizes[d];
    if (box.sizes[d] != shape[d]) break;  // an earlier dimension's next step jumps past other boxes
  }
  return block;
}

}  // namespace

BoxAssembly::BoxAssembly(const std::string& name, std::vector<int64_t> shape, std::vector<Box> boxes)
    : shape_(std::move(shape)), boxes_(std::move(boxes)) {
  const size_t dims = shape_.size();
  const auto fail = [&](const std::string& what) {
    throw FormatError(fmt::format("tensor {} [{}]: {}", name, fmt::join(shape_, ", "), what));
  };
  edges_.resize(dims);
  for (size_t d = 0; d < dims; ++d) {
    if (shape_[d] < 0) fail("negative dimension");
    edges_[d] = {0, shape_[d]};
  }
  for (const Box& b : boxes_) {
    const auto where =
        fmt::format("chunk at [{}] of size [{}]", fmt::join(b.offsets, ", "), fmt::join(b.sizes, ", "));
    if (b.offsets.size() != dims || b.sizes.size() != dims) fail(where + ": wrong number of dimensions");
    if (b.source.shape != b.sizes)
      fail(fmt::format("{}: its source tensor has shape [{}]", where, fmt::join(b.source.shape, ", ")));
    for (size_t d = 0; d < dims; ++d) {
      if (b.offsets[d] < 0 || b.sizes[d] < 0 || b.offsets[d] > shape_[d] ||
          b.sizes[d] > shape_[d] - b.offsets[d])
        fail(where + ": lies outside the tensor");
      edges_[d].push_back(b.offsets[d]);
      edges_[d].push_back(b.offsets[d] + b.sizes[d]);
    }
  }
  uint64_t cells = 1;
  cell_strides_.assign(dims, 1);
  for (size_t d = dims; d-- > 0;) {
    std::sort(edges_[d].begin(), edges_[d].end());
    edges_[d].erase(std::unique(edges_[d].begin(), edges_[d].end()), edges_[d].end());
    cell_strides_[d] = cells;
    const uint64_t n = edges_[d].size() > 1 ? edges_[d].size() - 1 : 1;
    if (cells > kMaxCells / n)
      fail(fmt::format("its {} chunks cut it into more than {} cells", boxes_.size(), kMaxCells));
    cells *= n;
  }
  if (volume(shape_) == 0) return;  // nothing to read; every (empty) box is fine
  constexpr uint32_t kNone = UINT32_MAX;
  cell_box_.assign(cells, kNone);
  for (size_t i = 0; i < boxes_.size(); ++i) {
    const Box& b = boxes_[i];
    if (volume(b.sizes) == 0) continue;
    // The cells the box covers: a range of cell indexes per dimension, walked as an odometer.
    std::vector<uint64_t> lo(dims), hi(dims), at(dims);
    for (size_t d = 0; d < dims; ++d) {
      lo[d] = std::lower_bound(edges_[d].begin(), edges_[d].end(), b.offsets[d]) - edges_[d].begin();
      hi[d] =
          std::lower_bound(edges_[d].begin(), edges_[d].end(), b.offsets[d] + b.sizes[d]) - edges_[d].begin();
    }
    at = lo;
    while (true) {
      uint64_t cell = 0;
      for (size_t d = 0; d < dims; ++d) cell += at[d] * cell_strides_[d];
      if (cell_box_[cell] != kNone) {
        const Box& other = boxes_[cell_box_[cell]];
        fail(fmt::format("chunks at [{}] and [{}] overlap", fmt::join(other.offsets, ", "),
                         fmt::join(b.offsets, ", ")));
      }
      cell_box_[cell] = static_cast<uint32_t>(i);
      size_t d = dims;
      while (d > 0 && ++at[d - 1] == hi[d - 1]) {
        at[d - 1] = lo[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  for (uint64_t cell = 0; cell < cells; ++cell) {
    if (cell_box_[cell] != kNone) continue;
    std::vector<int64_t> start(dims);
    for (size_t d = 0; d < dims; ++d)
      start[d] = edges_[d][(cell / cell_strides_[d]) % (edges_[d].size() - 1)];
    fail(fmt::format("the elements at [{}] are in no chunk", fmt::join(start, ", ")));
  }
  for (const Box& b : boxes_) block_dim_.push_back(contiguous_block_dim(b, shape_));
}

size_t BoxAssembly::box_at(std::span<const int64_t> index) const {
  uint64_t cell = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    const auto& e = edges_[d];
    cell += (std::upper_bound(e.begin(), e.end(), index[d]) - e.begin() - 1) * cell_strides_[d];
  }
  return cell_box_[cell];
}

void BoxAssembly::plan(uint64_t first, uint64_t count, std::vector<Piece>& out) const {
  const size_t dims = shape_.size();
  // The element's index, on the stack for up to kInlineDims dimensions: planning a read allocates nothing.
  constexpr size_t kInlineDims = 8;
  std::array<int64_t, kInlineDims> inline_index;
  std::vector<int64_t> heap_index(dims > kInlineDims ? dims : 0);
  const std::span<int64_t> index =
      dims > kInlineDims ? std::span(heap_index) : std::span(inline_index).first(dims);
  for (uint64_t e = first, end = first + count; e < end;) {
    for (size_t d = dims, rest = e; d-- > 0;) {  // unravel e (row-major)
      index[d] = static_cast<int64_t>(rest % static_cast<uint64_t>(shape_[d]));
      rest /= static_cast<uint64_t>(shape_[d]);
    }
    const size_t i = box_at(index);
    const Box& b = boxes_[i];
    const size_t block = block_dim_[i];
    int64_t src = b.source.storage_offset;
    for (size_t d = 0; d < dims; ++d) src += (index[d] - b.offsets[d]) * b.source.strides[d];
    uint64_t run = 1;
    if (block < dims) {  // to the end of the box along `block`, whole trailing dimensions included
      uint64_t inner = 1, position = 0;
      for (size_t d = dims; d-- > block + 1;) {
        position += static_cast<uint64_t>(index[d]) * inner;
        inner *= static_cast<uint64_t>(shape_[d]);
      }
      run = static_cast<uint64_t>(b.offsets[block] + b.sizes[block] - index[block]) * inner - position;
    }
    run = std::min(run, end - e);
    if (b.inner) {  // the inner tensor's runs, moved from its element index to ours
      const size_t before = out.size();
      append_runs(*b.inner, static_cast<uint64_t>(src), run, out);
      for (size_t k = before; k < out.size(); ++k)
        out[k].dst_begin = out[k].dst_begin - static_cast<uint64_t>(src) + e;
    } else {
      const uint64_t item = dtype_size(b.source.dtype);
      out.push_back({e, run, b.source.storage.file,
                     b.source.storage.offset + static_cast<uint64_t>(src) * item, b.source.dtype});
    }
    e += run;
  }
}

}  // namespace ckptfs::catalog
