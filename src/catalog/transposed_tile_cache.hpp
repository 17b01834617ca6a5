// The tiles of transposed tensors that one command's reads share (catalog::TransposeCache): how a tensor is
// cut into tiles (TileGrid), the last kTiles tiles built, the pool of their buffers and the thread that
// builds the next tile ahead of a reader. Each command makes its own (make_transpose_cache: the mount's -o
// transpose_cache_mb) and its transposed tensors hold it (Transposed::tiles).
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::catalog {

// A tile's elements (row-major) in a buffer of the pool, and how many of its bytes readers have served: a
// tile served as many bytes as it holds has been read to its end by a front-to-back reader, whatever order
// the kernel's concurrent readahead requests were served in.
struct Tile {
  std::shared_ptr<std::byte[]> bytes;
  uint64_t size = 0;
  mutable std::atomic<uint64_t> served{0};
  bool read_to_end() const { return served.load(std::memory_order_relaxed) >= size; }
};
using TileData = std::shared_ptr<const Tile>;

// The output rows x columns of every tile of a [rows, cols] tensor of `size`-byte elements, tiles of at most
// `tile_bytes` (edge tiles are clipped). A tensor whose tiles fit in half the cache (two such tensors then
// fit: a front-to-back reader's requests straddle the boundary of two) is cut into tiles of whole output
// columns: each is a band of whole source rows, read with no byte it does not need, and a front-to-back
// reader finds all the tiles of a row in the cache at once. A larger tensor is cut into tiles of whole
// output rows where kMinTileRows of them fit (each reads the tile's columns of every source row, taking in
// the gaps: more bytes than the tile, but as few reads), else into blocks.
struct TileGrid {
  TileGrid(uint64_t rows_, uint64_t cols_, uint64_t size, uint64_t tile_bytes);
  uint64_t rows, cols;  // of the tensor
  uint64_t tile_rows, tile_cols;
  uint64_t tiles_across() const { return (cols + tile_cols - 1) / tile_cols; }
  bool operator==(const TileGrid&) const = default;
};

// Whether building a tile may evict a tile not yet read to its end: a reader's may, one built ahead may not
// (it would push out what a reader still needs for what it may need later).
enum class Eviction { any, finished_only };

class TilePool;

// The last tiles built, shared by all threads reading through it; a tile being built is waited for, not
// built twice. Memory is bounded by its size, one more tile buffer, a band and a span buffer per building
// thread, and tiles evicted while a reply or a thread still reads them.
class TransposeCache {
 public:
  static constexpr size_t kTiles = 8;

  explicit TransposeCache(uint64_t bytes);  // at least 1 MiB; kTiles tiles of at most an eighth of it
  ~TransposeCache();
  TransposeCache(const TransposeCache&) = delete;
  TransposeCache& operator=(const TransposeCache&) = delete;

  // How the transposed `tensor` (2-D) is cut into tiles of this cache.
  TileGrid grid(const LogicalTensor& tensor) const;

  // Tile `index` of `grid` over the transpose of `src`, built if it is not cached; null when `eviction`
  // forbids making room for it.
  TileData get(const std::shared_ptr<const LogicalTensor>& src, uint64_t index, const TileGrid& grid,
               Eviction eviction = Eviction::any);

  // Has the tile built on the prebuilder's thread while the threads serving a front-to-back reader copy
  // from the current one; dropped while it is busy, and when there is no room for the tile without evicting
  // one not yet read to its end.
  void build_ahead(const std::shared_ptr<const LogicalTensor>& src, uint64_t index, const TileGrid& grid);

 private:
  class Prebuilder;
  struct Entry {
    std::shared_ptr<const LogicalTensor> src;  // held, so that its address names no other tensor meanwhile
    TileGrid grid;                             // the tiling in force when it was built
    uint64_t index;
    std::shared_future<TileData> data;
    uint64_t last_use;
    uint64_t serial;  // this entry's own, apart from a later one of the same tile
  };
  bool make_room(Eviction eviction);

  uint64_t tile_bytes_;
  std::shared_ptr<TilePool>
      pool_;  // kept by the buffers it lends too: a reply may hold a tile past the cache
  std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  std::unique_ptr<Prebuilder> prebuilder_;  // last: its thread stops before what it uses goes
};

}  // namespace ckptfs::catalog
