// Source tensors (any strides) turned into flat runs of a logical tensor's element space.
#include <fmt/format.h>

#include <algorithm>

#include "ckptfs/catalog.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::catalog {

namespace {

// Elements a view that repeats storage elements (stride 0, overlapping strides) may name beyond what its
// storage holds; every repeated run becomes a piece, so a tiny storage expanded to 2^40 elements would
// otherwise need terabytes of pieces.
constexpr uint64_t kMaxRepeatedElements = uint64_t{1} << 16;

// Appends `p`, extending the last piece instead when p continues it in both spaces.
void push_piece(std::vector<Piece>& pieces, Piece p) {
  if (!pieces.empty()) {
    Piece& last = pieces.back();
    if (last.file == p.file && last.src_dtype == p.src_dtype && last.dst_begin + last.count == p.dst_begin &&
        last.src_offset + last.count * dtype_size(last.src_dtype) == p.src_offset) {
      last.count += p.count;
      return;
    }
  }
  pieces.push_back(std::move(p));
}

// The element layout of a strided tensor as blocks of `block` contiguous elements, enumerated by an
// odometer over the outer dimensions (size-1 dimensions dropped, contiguous inner ones folded in).
struct BlockLayout {
  uint64_t block = 1;
  std::vector<int64_t> sizes, strides;  // outer dimensions, outermost first

  explicit BlockLayout(const torch::SourceTensor& src) {
    size_t d = src.shape.size();
    while (d > 0 && (src.shape[d - 1] == 1 || src.strides[d - 1] == static_cast<int64_t>(block))) {
      block *= static_cast<uint64_t>(src.shape[d - 1]);
      --d;
    }
    for (size_t i = 0; i < d; ++i) {
      if (src.shape[i] == 1) continue;
      sizes.push_back(src.shape[i]);
      strides.push_back(src.strides[i]);
    }
  }
};

}  // namespace

void append_source_range(std::vector<Piece>& pieces, uint64_t dst_begin, const torch::SourceTensor& src,
                         uint64_t first, uint64_t count) {
  const uint64_t numel = src.numel();
  if (first > numel || count > numel - first)
    throw FormatError(fmt::format("{}: elements [{}, {}) requested from a tensor of {} elements",
                                  src.storage.file->path().string(), first, first + count, numel));
  if (count == 0) return;
  if (src.strides.size() != src.shape.size())
    throw FormatError(fmt::format("{}: tensor has {} dimensions but {} strides",
                                  src.storage.file->path().string(), src.shape.size(), src.strides.size()));

  const uint64_t elem = dtype_size(src.dtype);
  const uint64_t capacity = src.storage.nbytes / elem;
  if (count > std::max(capacity, kMaxRepeatedElements))
    throw UnsupportedError(
        fmt::format("{}: a tensor view of {} elements over a storage of {} repeats storage "
                    "elements (stride 0 or overlapping strides); ckptfs serves at most {} "
                    "such elements",
                    src.storage.file->path().string(), count, capacity, kMaxRepeatedElements));

  const BlockLayout layout(src);
  // Odometer position of the block holding `first`, and the element address of that block's start.
  std::vector<int64_t> index(layout.sizes.size());
  uint64_t block_index = first / layout.block;
  int64_t base = src.storage_offset;
  for (size_t i = index.size(); i-- > 0;) {
    index[i] = static_cast<int64_t>(block_index % static_cast<uint64_t>(layout.sizes[i]));
    block_index /= static_cast<uint64_t>(layout.sizes[i]);
    base += index[i] * layout.strides[i];
  }
  uint64_t within = first % layout.block;
  while (count > 0) {
    const uint64_t run = std::min(count, layout.block - within);
    push_piece(pieces,
               Piece{dst_begin, run, src.storage.file,
                     src.storage.offset + static_cast<uint64_t>(base) * elem + within * elem, src.dtype});
    dst_begin += run;
    count -= run;
    within = 0;
    for (size_t i = index.size(); i-- > 0;) {  // next block
      base += layout.strides[i];
      if (++index[i] < layout.sizes[i]) break;
      base -= index[i] * layout.strides[i];
      index[i] = 0;
    }
  }
}

void append_source_tensor(std::vector<Piece>& pieces, uint64_t dst_begin, const torch::SourceTensor& src) {
  append_source_range(pieces, dst_begin, src, 0, src.numel());
}

LogicalTensor whole_tensor(const std::string& name, const torch::SourceTensor& src, DType dtype,
                           std::string origin) {
  LogicalTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = src.shape;
  t.origin = std::move(origin);
  FlatRuns flat;
  append_source_tensor(flat.pieces, 0, src);
  t.source = std::move(flat);
  return t;
}

}  // namespace ckptfs::catalog
