// A transposed tensor of shape [C, R] over a source of shape [R, C] is served from tiles of the output:
// kTileRows(C, R) output rows (source columns) x up to all R output columns (source rows), at most
// kTileBytes. A tile is built by reading its source rows in bands of at most kBandBytes (one read per
// source row segment, or one read per band when the tile spans every source column) and transposing each
// band in 32 x 32 blocks. The last kCacheTiles tiles are shared by all threads (a front-to-back read of a
// tensor builds each tile once, whichever threads serve it), so memory is bounded by
// kCacheTiles * kTileBytes (32 MiB) plus one band buffer per building thread, plus tiles evicted while a
// thread still copies from them.
#include "catalog/transposed_reader.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>

namespace ckptfs::catalog {

namespace {

constexpr uint64_t kTileBytes = uint64_t{8} << 20;
constexpr uint64_t kBandBytes = uint64_t{1} << 20;
constexpr size_t kCacheTiles = 4;
constexpr uint64_t kMinTileRows = 64;  // a tile is at least this many output rows when rows are very long
constexpr uint64_t kBlock = 32;        // the side of the blocks a band is transposed in

using TileData = std::shared_ptr<const std::vector<std::byte>>;

// The output rows x columns of every tile of a [rows, cols] tensor of `size`-byte elements (edge tiles
// are clipped).
struct TileGrid {
  uint64_t rows, cols;  // of the tensor
  uint64_t tile_rows, tile_cols;
  TileGrid(uint64_t rows_, uint64_t cols_, uint64_t size) : rows(rows_), cols(cols_) {
    tile_cols = std::max<uint64_t>(1, std::min(cols, kTileBytes / size / kMinTileRows));
    tile_rows = std::max<uint64_t>(1, std::min(rows, kTileBytes / size / tile_cols));
  }
  uint64_t tiles_across() const { return (cols + tile_cols - 1) / tile_cols; }
};

// dst[i * dst_stride + k] = src[k * src_stride + i] for i < n_i, k < n_k, in blocks that stay in cache.
template <size_t kSize>
void transpose_block(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride, uint64_t n_k,
                     uint64_t n_i) {
  for (uint64_t kb = 0; kb < n_k; kb += kBlock)
    for (uint64_t ib = 0; ib < n_i; ib += kBlock)
      for (uint64_t k = kb; k < std::min(n_k, kb + kBlock); ++k)
        for (uint64_t i = ib; i < std::min(n_i, ib + kBlock); ++i)
          std::memcpy(dst + (i * dst_stride + k) * kSize, src + (k * src_stride + i) * kSize, kSize);
}

void transpose(uint64_t size, const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
               uint64_t n_k, uint64_t n_i) {
  switch (size) {
    case 1: return transpose_block<1>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 2: return transpose_block<2>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4: return transpose_block<4>(src, src_stride, dst, dst_stride, n_k, n_i);
    default: return transpose_block<8>(src, src_stride, dst, dst_stride, n_k, n_i);
  }
}

// Output rows [row0, row0 + n_rows) x columns [col0, col0 + n_cols) of the transpose of `src` ([R, C]),
// row-major with stride n_cols.
std::vector<std::byte> build_tile(const LogicalTensor& src, uint64_t row0, uint64_t n_rows, uint64_t col0,
                                  uint64_t n_cols) {
  const uint64_t size = dtype_size(src.dtype), src_cols = static_cast<uint64_t>(src.shape[1]);
  std::vector<std::byte> tile(n_rows * n_cols * size);
  std::vector<std::byte> band;  // not thread_local: a source may itself be transposed
  const uint64_t band_rows = std::max<uint64_t>(1, kBandBytes / (n_rows * size));
  for (uint64_t r = 0; r < n_cols; r += band_rows) {  // source rows col0 + r ...
    const uint64_t n = std::min(band_rows, n_cols - r);
    band.resize(n * n_rows * size);
    if (n_rows == src_cols) {
      read_tensor(src, (col0 + r) * src_cols * size, band);
    } else {
      for (uint64_t k = 0; k < n; ++k)
        read_tensor(src, ((col0 + r + k) * src_cols + row0) * size,
                    std::span(band).subspan(k * n_rows * size, n_rows * size));
    }
    transpose(size, band.data(), n_rows, tile.data() + r * size, n_cols, n, n_rows);
  }
  return tile;
}

// The last tiles built, shared by all threads; a tile being built is waited for, not built twice.
class TileCache {
 public:
  TileData get(const std::shared_ptr<const LogicalTensor>& src, uint64_t index, const TileGrid& grid) {
    std::promise<TileData> promise;
    std::shared_future<TileData> ready;
    {
      std::lock_guard lock(mutex_);
      ++clock_;
      for (Entry& e : entries_)
        if (e.src == src && e.index == index) {
          e.last_use = clock_;
          ready = e.data;
        }
      if (!ready.valid()) {
        if (entries_.size() == kCacheTiles)
          entries_.erase(std::min_element(entries_.begin(), entries_.end(),
                                          [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; }));
        entries_.push_back({src, index, promise.get_future().share(), clock_});
      }
    }
    if (ready.valid()) return ready.get();
    try {
      const uint64_t row0 = index / grid.tiles_across() * grid.tile_rows;
      const uint64_t col0 = index % grid.tiles_across() * grid.tile_cols;
      auto tile = std::make_shared<const std::vector<std::byte>>(build_tile(
          *src, row0, std::min(grid.tile_rows, grid.rows - row0), col0, std::min(grid.tile_cols, grid.cols - col0)));
      promise.set_value(tile);
      return tile;
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard lock(mutex_);  // a failed read is retried by the next request
      std::erase_if(entries_, [&](const Entry& e) { return e.src == src && e.index == index; });
      throw;
    }
  }

 private:
  struct Entry {
    std::shared_ptr<const LogicalTensor> src;  // held, so that its address names no other tensor meanwhile
    uint64_t index;
    std::shared_future<TileData> data;
    uint64_t last_use;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

TileCache& tile_cache() {
  static TileCache cache;
  return cache;
}

}  // namespace

void read_transposed(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                     std::span<std::byte> out) {
  const uint64_t size = dtype_size(tensor.dtype);
  const TileGrid grid(static_cast<uint64_t>(tensor.shape[0]), static_cast<uint64_t>(tensor.shape[1]), size);
  TileData tile;
  uint64_t tile_index = 0;
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t row = e / grid.cols, col = e % grid.cols;
    const uint64_t index = row / grid.tile_rows * grid.tiles_across() + col / grid.tile_cols;
    if (!tile || index != tile_index) {
      tile = tile_cache().get(source.of, index, grid);
      tile_index = index;
    }
    const uint64_t col0 = col / grid.tile_cols * grid.tile_cols;
    const uint64_t width = std::min(grid.tile_cols, grid.cols - col0);
    const uint64_t n = std::min({end - e, col0 + width - col});
    std::memcpy(out.data() + (e - first) * size,
                tile->data() + ((row % grid.tile_rows) * width + (col - col0)) * size, n * size);
    e += n;
  }
}

void append_transposed_runs(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                            std::vector<Piece>& out) {
  if (count == 0) return;
  const uint64_t rows = static_cast<uint64_t>(tensor.shape[1]), cols = static_cast<uint64_t>(tensor.shape[0]);
  const uint64_t last = first + count - 1;
  const uint64_t col_lo = first / rows, col_hi = last / rows;  // source columns
  const uint64_t row_lo = col_lo == col_hi ? first % rows : 0, row_hi = col_lo == col_hi ? last % rows : rows - 1;
  for (uint64_t r = row_lo; r <= row_hi; ++r)
    append_runs(*source.of, r * cols + col_lo, col_hi - col_lo + 1, out);
}

}  // namespace ckptfs::catalog
