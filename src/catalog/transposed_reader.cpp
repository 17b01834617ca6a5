// The read path of a transposed tensor of shape [C, R] over a source of shape [R, C]: elements served from
// the tiles of the tensor's TransposeCache (transposed_tile_cache.hpp), each row of the read copied from the
// tiles it crosses or left to the reply as bytes of the tile (catalog::HeldBytes); the next tile a
// front-to-back reader will need is built meanwhile on the cache's prebuilder thread (the next tile of a
// row of tiles, or, past the middle of a tile of whole rows, the next one).
#include "catalog/transposed_reader.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "catalog/transposed_tile_cache.hpp"

namespace ckptfs::catalog {

void read_transposed(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                     std::span<std::byte> out, std::vector<DeferredRun>* deferred) {
  const uint64_t size = dtype_size(tensor.dtype);
  TransposeCache& cache = *source.tiles;
  const TileGrid grid = cache.grid(tensor);
  // The tiles this read has taken from the cache: a row crosses every tile of a tile row, and a read of
  // many rows goes back to each many times.
  std::array<std::pair<uint64_t, TileData>, TransposeCache::kTiles / 2> taken;
  size_t next_slot = 0;
  const auto take = [&](uint64_t index, bool next_needed) -> const TileData& {
    for (const auto& [i, data] : taken)
      if (data && i == index) return data;
    // A row crossing several tiles needs them all: the next is built meanwhile on the prebuilder's thread.
    if (next_needed) cache.build_ahead(source.of, index + 1, grid);
    auto& slot = taken[next_slot++ % taken.size()];
    slot = {index, cache.get(source.of, index, grid)};
    return slot.second;
  };
  for (uint64_t e = first, end = first + count; e < end;) {
    const uint64_t row = e / grid.cols, col = e % grid.cols;
    const uint64_t col0 = col / grid.tile_cols * grid.tile_cols;
    const uint64_t width = std::min(grid.tile_cols, grid.cols - col0);
    const TileData& tile = take(row / grid.tile_rows * grid.tiles_across() + col / grid.tile_cols,
                                col0 + width < grid.cols && row * grid.cols + col0 + width < end);
    const uint64_t tile_end_row = std::min(row / grid.tile_rows * grid.tile_rows + grid.tile_rows, grid.rows);
    // A tile of whole rows holds them one after another; others hold a part of each row.
    const uint64_t n =
        std::min(end - e, width == grid.cols ? tile_end_row * grid.cols - e : col0 + width - col);
    std::byte* const dst = out.data() + (e - first) * size;
    const std::byte* const src = tile->bytes.get() + ((row % grid.tile_rows) * width + (col - col0)) * size;
    if (deferred != nullptr && n * size >= kMinHeldRun && deferred->size() < kMaxDeferredRuns)
      deferred->push_back({HeldBytes{tile, src}, dst, n * size});
    else
      std::memcpy(dst, src, n * size);
    tile->served.fetch_add(n * size, std::memory_order_relaxed);
    e += n;
  }
  // A reader past the middle of a tile of whole rows is likely to read the next one soon: build it now.
  const uint64_t last_row = (first + count - 1) / grid.cols;
  if (count > 0 && grid.tiles_across() == 1 && last_row % grid.tile_rows >= grid.tile_rows / 2 &&
      last_row / grid.tile_rows + 1 < (grid.rows + grid.tile_rows - 1) / grid.tile_rows)
    cache.build_ahead(source.of, last_row / grid.tile_rows + 1, grid);
}

void build_transposed_ahead(const LogicalTensor& tensor, const Transposed& source, uint64_t first,
                            uint64_t count) {
  const TileGrid grid = source.tiles->grid(tensor);
  // The first tile whose first element is in the range: in the range's row of tiles if it starts on the
  // first row of one, else at the start of the next.
  const uint64_t row = first / grid.cols, col = first % grid.cols;
  const uint64_t band = row / grid.tile_rows * grid.tile_rows;
  uint64_t row0 = band + grid.tile_rows, col0 = 0;
  if (band == row && (col + grid.tile_cols - 1) / grid.tile_cols * grid.tile_cols < grid.cols) {
    row0 = band;
    col0 = (col + grid.tile_cols - 1) / grid.tile_cols * grid.tile_cols;
  }
  if (row0 >= grid.rows || row0 * grid.cols + col0 >= first + count) return;
  source.tiles->build_ahead(source.of, row0 / grid.tile_rows * grid.tiles_across() + col0 / grid.tile_cols,
                            grid);
}

void append_transposed_runs(const LogicalTensor& tensor, const Transposed& source, uint64_t first,
                            uint64_t count, std::vector<Piece>& out) {
  const TileGrid grid = source.tiles->grid(tensor);
  const uint64_t end = first + count;
  for (uint64_t row0 = (first / grid.cols + grid.tile_rows - 1) / grid.tile_rows * grid.tile_rows;
       row0 < grid.rows && row0 * grid.cols < end; row0 += grid.tile_rows)
    for (uint64_t col0 = 0; col0 < grid.cols && row0 * grid.cols + col0 < end; col0 += grid.tile_cols) {
      if (row0 * grid.cols + col0 < first) continue;
      // The tile's source block: source rows [col0, +width) x source columns [row0, +height).
      const uint64_t height = std::min(grid.tile_rows, grid.rows - row0);
      for (uint64_t r = col0; r < std::min(grid.cols, col0 + grid.tile_cols); ++r)
        append_runs(*source.of, r * grid.rows + row0, height, out);
    }
}

}  // namespace ckptfs::catalog
