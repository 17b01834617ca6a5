// A transposed tensor of shape [C, R] over a source of shape [R, C] is served from tiles of the output,
// each at most an eighth of the cache (16 MiB by default; TileGrid says how a tensor is cut): whole
// output columns (whole source rows, each source byte read once) when the tensor fits in half the
// cache, else whole output rows (source columns) when kMinTileRows of them fit in a tile. A tile is
// built in bands of source rows: the band's runs (one per source row and shard, from the source's own
// planner) are sorted by file and offset and read in spans of at most kSpanBytes that take in the gaps
// between runs up to kMaxGapBytes (a gap is cheaper to read than a pread), so a tile over a
// tensor-parallel source costs a few large reads per shard, never one per row or element. Each band
// (kBandBytes, cache-resident) is transposed into the tile in 8 x 8 (16-bit) or 4 x 4 (32-bit) SIMD
// blocks. The last kCacheTiles tiles are shared by all server threads (a front-to-back read builds each
// tile once, whichever threads serve it); the next tile of a row of tiles, or past the middle of a tile
// of whole rows the next one, is built meanwhile on a thread of its own (TilePrebuilder). Replies take
// their bytes straight from the tiles (catalog::HeldBytes). Memory is bounded by the cache's size
// (128 MiB by default, -o transpose_cache_mb), one spare tile buffer, a band and a span buffer per
// building thread, and tiles evicted while a reply or a thread still reads them.
#include "catalog/transposed_reader.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include <sys/mman.h>

#include "catalog/dtype_convert.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckptfs::catalog {

namespace {

constexpr size_t kCacheTiles = 8;
std::atomic<uint64_t> tile_bytes = kDefaultTransposedCacheBytes / kCacheTiles;
constexpr uint64_t kMinTileRows = 64;  // a tile is at least this many output rows when rows are very long
constexpr uint64_t kBandBytes = uint64_t{512} << 10;  // the source elements a band gathers (fits L2)
constexpr uint64_t kSpanBytes = uint64_t{1} << 20;    // the most one coalesced read spans
constexpr uint64_t kMaxGapBytes = uint64_t{16} << 10;  // unneeded bytes read rather than one more pread
constexpr uint64_t kBlock = 32;  // the source rows a pass of the transpose covers (64 B of a bf16 output row)

// A tile's elements (row-major) in a buffer of the pool, and whether a reader has served its last one.
struct Tile {
  std::shared_ptr<std::byte[]> bytes;
  mutable std::atomic<bool> read_to_end{false};
};
using TileData = std::shared_ptr<const Tile>;

// `extent` cut into equal parts of at most `most` (the last one shorter by less than the part count).
uint64_t balanced_part(uint64_t extent, uint64_t most) {
  const uint64_t parts = (extent + most - 1) / most;
  return (extent + parts - 1) / parts;
}

// The output rows x columns of every tile of a [rows, cols] tensor of `size`-byte elements (edge tiles
// are clipped). A tensor whose tiles fit in half the cache (two such tensors then fit: a front-to-back
// reader's requests straddle the boundary of two) is cut into tiles of whole
// output columns: each is a band of whole source rows, read with no byte it does not need, and a
// front-to-back reader finds all the tiles of a row in the cache at once. A larger tensor is cut into
// tiles of whole output rows where kMinTileRows of them fit (each reads the tile's columns of every
// source row, taking in the gaps: more bytes than the tile, but as few reads), else into blocks.
struct TileGrid {
  uint64_t rows, cols;  // of the tensor
  uint64_t tile_rows, tile_cols;
  TileGrid(uint64_t rows_, uint64_t cols_, uint64_t size) : rows(std::max<uint64_t>(rows_, 1)), cols(std::max<uint64_t>(cols_, 1)) {
    const uint64_t most = tile_bytes.load(std::memory_order_relaxed) / size;
    if (rows <= most && (cols + most / rows - 1) / (most / rows) <= kCacheTiles / 2) {
      tile_rows = rows;
      tile_cols = balanced_part(cols, most / rows);
      return;
    }
    tile_cols = balanced_part(cols, std::max<uint64_t>(1, most / kMinTileRows));
    tile_rows = balanced_part(rows, std::max<uint64_t>(1, most / tile_cols));
  }
  uint64_t tiles_across() const { return (cols + tile_cols - 1) / tile_cols; }
  bool operator==(const TileGrid&) const = default;
};

// ---- the transpose: dst[i * dst_stride + k] = src[k * src_stride + i] for k < n_k, i < n_i (strides in
// elements), in blocks of kBlock source rows so that each output row gets whole cache lines --------------

template <size_t kSize>
void transpose_scalar(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride, uint64_t n_k,
                      uint64_t n_i) {
  for (uint64_t kb = 0; kb < n_k; kb += kBlock)
    for (uint64_t i = 0; i < n_i; ++i)
      for (uint64_t k = kb; k < std::min(n_k, kb + kBlock); ++k)
        std::memcpy(dst + (i * dst_stride + k) * kSize, src + (k * src_stride + i) * kSize, kSize);
}

#if defined(__SSE2__)
// One 8 x 8 block of 16-bit elements; strides in bytes.
void transpose_8x8_16(const std::byte* s, uint64_t ss, std::byte* d, uint64_t ds) {
  __m128i r[8], t[8], u[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h)  // rows 0-3, 4-7
    for (int k = 0; k < 2; ++k) {
      u[4 * h + 2 * k] = _mm_unpacklo_epi32(t[4 * h + k], t[4 * h + k + 2]);
      u[4 * h + 2 * k + 1] = _mm_unpackhi_epi32(t[4 * h + k], t[4 * h + k + 2]);
    }
  for (int c = 0; c < 4; ++c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * c) * ds), _mm_unpacklo_epi64(u[c], u[c + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * c + 1) * ds), _mm_unpackhi_epi64(u[c], u[c + 4]));
  }
}

// One 4 x 4 block of 32-bit elements; strides in bytes.
void transpose_4x4_32(const std::byte* s, uint64_t ss, std::byte* d, uint64_t ds) {
  __m128i r[4];
  for (int k = 0; k < 4; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  const __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]), t1 = _mm_unpackhi_epi32(r[0], r[1]);
  const __m128i t2 = _mm_unpacklo_epi32(r[2], r[3]), t3 = _mm_unpackhi_epi32(r[2], r[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi64(t0, t2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + ds), _mm_unpackhi_epi64(t0, t2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * ds), _mm_unpacklo_epi64(t1, t3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 3 * ds), _mm_unpackhi_epi64(t1, t3));
}

// The blocks of kMicro x kMicro elements through `kernel`, the edges element by element.
template <size_t kSize, uint64_t kMicro, auto kernel>
void transpose_simd(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride, uint64_t n_k,
                    uint64_t n_i) {
  const uint64_t k_main = n_k / kMicro * kMicro, i_main = n_i / kMicro * kMicro;
  for (uint64_t kb = 0; kb < k_main; kb += kBlock)
    for (uint64_t i = 0; i < i_main; i += kMicro)
      for (uint64_t k = kb; k < std::min(k_main, kb + kBlock); k += kMicro)
        kernel(src + (k * src_stride + i) * kSize, src_stride * kSize, dst + (i * dst_stride + k) * kSize,
               dst_stride * kSize);
  transpose_scalar<kSize>(src + k_main * src_stride * kSize, src_stride, dst + k_main * kSize, dst_stride,
                          n_k - k_main, n_i);
  transpose_scalar<kSize>(src + i_main * kSize, src_stride, dst + i_main * dst_stride * kSize, dst_stride, k_main,
                          n_i - i_main);
}
#endif

void transpose(uint64_t size, const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
               uint64_t n_k, uint64_t n_i) {
  switch (size) {
    case 1: return transpose_scalar<1>(src, src_stride, dst, dst_stride, n_k, n_i);
#if defined(__SSE2__)
    case 2: return transpose_simd<2, 8, transpose_8x8_16>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4: return transpose_simd<4, 4, transpose_4x4_32>(src, src_stride, dst, dst_stride, n_k, n_i);
#else
    case 2: return transpose_scalar<2>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4: return transpose_scalar<4>(src, src_stride, dst, dst_stride, n_k, n_i);
#endif
    default: return transpose_scalar<8>(src, src_stride, dst, dst_stride, n_k, n_i);
  }
}

// ---- bands of source rows, read with few large reads ---------------------------------------------------

// Reads source rows [row0, row0 + n) x columns [col0, col0 + width) of `src` ([R, C], served in
// src.dtype) into `band` (row-major, stride width).
class BandReader {
 public:
  void read(const LogicalTensor& src, uint64_t row0, uint64_t n, uint64_t col0, uint64_t width,
            std::span<std::byte> band) {
    const uint64_t cols = static_cast<uint64_t>(src.shape[1]), size = dtype_size(src.dtype);
    if (std::holds_alternative<Transposed>(src.source)) {  // its runs are its own source's, not placeable: read row by row
      for (uint64_t k = 0; k < n; ++k)
        read_tensor(src, ((row0 + k) * cols + col0) * size, band.subspan(k * width * size, width * size));
      return;
    }
    runs_.clear();
    if (width == cols)
      append_runs(src, row0 * cols, n * cols, runs_);
    else
      for (uint64_t k = 0; k < n; ++k) append_runs(src, (row0 + k) * cols + col0, width, runs_);
    order_.resize(runs_.size());
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      const Piece &x = runs_[a], &y = runs_[b];
      return x.file != y.file ? x.file.get() < y.file.get() : x.src_offset < y.src_offset;
    });
    // Where a run's elements go in the band (a run never crosses a row unless the band has whole rows).
    const auto place = [&](const Piece& p) {
      return band.subspan(((p.dst_begin / cols - row0) * width + p.dst_begin % cols - col0) * size, p.count * size);
    };
    for (size_t i = 0; i < order_.size();) {
      const Piece& first = runs_[order_[i]];
      const uint64_t begin = first.src_offset;
      uint64_t end = begin + bytes_of(first);
      size_t j = i + 1;
      for (; j < order_.size(); ++j) {
        const Piece& p = runs_[order_[j]];
        const uint64_t p_end = std::max(end, p.src_offset + bytes_of(p));
        if (p.file != first.file || p.src_offset > end + kMaxGapBytes || p_end - begin > kSpanBytes) break;
        end = p_end;
      }
      if (j == i + 1 && first.src_dtype == src.dtype) {
        first.file->read_exact(begin, place(first));
      } else {
        span_.resize(end - begin);
        first.file->read_exact(begin, span_);
        for (size_t k = i; k < j; ++k) {
          const Piece& p = runs_[order_[k]];
          const auto in = std::span<const std::byte>(span_).subspan(p.src_offset - begin, bytes_of(p));
          if (p.src_dtype == src.dtype)
            std::memcpy(place(p).data(), in.data(), in.size());
          else
            convert(p.src_dtype, src.dtype, in, place(p));
        }
      }
      i = j;
    }
  }

 private:
  static uint64_t bytes_of(const Piece& p) { return p.count * dtype_size(p.src_dtype); }

  std::vector<Piece> runs_;
  std::vector<size_t> order_;
  std::vector<std::byte> span_;
};

// Tile buffers given back by the last reader of an evicted tile, kept for the next tile: a fresh 16 MiB
// buffer costs 4,096 page faults and as many pages cleared. Every buffer has the capacity of the largest
// tile, so that any spare fits any tile, and asks for transparent huge pages (8 faults for 16 MiB where the
// kernel has them to give). At most kSpareTiles are kept, so memory stays bounded.
class TilePool {
 public:
  // A buffer of at least `bytes` (contents unspecified: the tile writes every byte) that returns here
  // when its last holder drops it.
  ~TilePool() {
    for (const Spare& s : spares_) std::free(s.buffer);
  }
  std::shared_ptr<std::byte[]> take(uint64_t bytes) {
    const uint64_t capacity = std::max(bytes, round_up(tile_bytes.load(std::memory_order_relaxed), kHugePage));
    {
      std::lock_guard lock(mutex_);
      const auto it = std::find_if(spares_.begin(), spares_.end(), [&](const Spare& s) { return s.capacity >= bytes; });
      if (it != spares_.end()) {
        const Spare spare = *it;
        spares_.erase(it);
        return {spare.buffer, [this, c = spare.capacity](std::byte* p) { give_back(p, c); }};
      }
    }
    void* memory = std::aligned_alloc(kHugePage, round_up(capacity, kHugePage));
    if (memory == nullptr) throw std::bad_alloc();
    madvise(memory, round_up(capacity, kHugePage), MADV_HUGEPAGE);  // advice: fine if refused
    return {static_cast<std::byte*>(memory), [this, capacity](std::byte* p) { give_back(p, capacity); }};
  }

 private:
  static constexpr size_t kSpareTiles = 2;
  static constexpr uint64_t kHugePage = uint64_t{2} << 20;
  static uint64_t round_up(uint64_t n, uint64_t unit) { return (n + unit - 1) / unit * unit; }
  struct Spare {
    std::byte* buffer;
    uint64_t capacity;
  };
  void give_back(std::byte* buffer, uint64_t capacity) {
    {
      std::lock_guard lock(mutex_);
      if (spares_.size() < kSpareTiles) return spares_.push_back({buffer, capacity});
    }
    std::free(buffer);
  }
  std::mutex mutex_;
  std::vector<Spare> spares_;
};

// Output rows [row0, row0 + n_rows) x columns [col0, col0 + n_cols) of the transpose of `src` ([R, C]),
// row-major with stride n_cols.
TileData build_tile(const LogicalTensor& src, uint64_t row0, uint64_t n_rows, uint64_t col0, uint64_t n_cols,
                    TilePool& pool) {
  const uint64_t size = dtype_size(src.dtype);
  auto tile = std::make_shared<Tile>();
  tile->bytes = pool.take(n_rows * n_cols * size);
  BandReader reader;  // not thread_local: a source may itself be transposed
  std::vector<std::byte> band;
  // Whole passes of the transpose per band: each output row then gets whole cache lines from a band.
  uint64_t band_rows = std::max<uint64_t>(1, kBandBytes / (n_rows * size));
  if (band_rows > kBlock) band_rows = band_rows / kBlock * kBlock;
  for (uint64_t r = 0; r < n_cols; r += band_rows) {  // source rows col0 + r ...
    const uint64_t n = std::min(band_rows, n_cols - r);
    band.resize(n * n_rows * size);
    reader.read(src, col0 + r, n, row0, n_rows, band);
    transpose(size, band.data(), n_rows, tile->bytes.get() + r * size, n_cols, n, n_rows);
  }
  return tile;
}

// Whether building a tile may evict a tile not yet read to its end: a reader's may, one built ahead may not
// (it would push out what a reader still needs for what it may need later).
enum class Eviction { any, finished_only };

// The last tiles built, shared by all threads; a tile being built is waited for, not built twice.
class TileCache {
 public:
  // The tile, built if it is not cached; null when `eviction` forbids making room for it.
  TileData get(const std::shared_ptr<const LogicalTensor>& src, uint64_t index, const TileGrid& grid,
               Eviction eviction = Eviction::any) {
    std::promise<TileData> promise;
    std::shared_future<TileData> ready;
    {
      std::lock_guard lock(mutex_);
      ++clock_;
      for (Entry& e : entries_)
        if (e.src == src && e.grid == grid && e.index == index) {
          e.last_use = clock_;
          ready = e.data;
        }
      if (!ready.valid()) {
        if (!make_room(eviction)) return nullptr;
        entries_.push_back({src, grid, index, promise.get_future().share(), clock_});
      }
    }
    if (ready.valid()) return ready.get();
    try {
      const uint64_t row0 = index / grid.tiles_across() * grid.tile_rows;
      const uint64_t col0 = index % grid.tiles_across() * grid.tile_cols;
      TileData tile = build_tile(*src, row0, std::min(grid.tile_rows, grid.rows - row0), col0,
                                 std::min(grid.tile_cols, grid.cols - col0), pool_);
      promise.set_value(tile);
      return tile;
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard lock(mutex_);  // a failed read is retried by the next request
      std::erase_if(entries_, [&](const Entry& e) { return e.src == src && e.grid == grid && e.index == index; });
      throw;
    }
  }

 private:
  // Under mutex_, before a new tile: a tile read to its end (a front-to-back reader has passed it) goes
  // first, full or not, so that its buffer serves the new tile instead of fresh memory (which the kernel
  // clears page by page); else, when the cache is full, the least recently used if `eviction` allows.
  // False when there is no room.
  bool make_room(Eviction eviction) {
    const auto finished = std::find_if(entries_.begin(), entries_.end(), [](const Entry& e) {
      if (e.data.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
      try {
        return e.data.get()->read_to_end.load(std::memory_order_relaxed);
      } catch (...) {
        return true;  // a failed build, about to be erased
      }
    });
    if (finished != entries_.end()) {
      entries_.erase(finished);
    } else if (entries_.size() == kCacheTiles) {
      if (eviction == Eviction::finished_only) return false;
      entries_.erase(std::min_element(entries_.begin(), entries_.end(),
                                      [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; }));
    }
    return true;
  }
  struct Entry {
    std::shared_ptr<const LogicalTensor> src;  // held, so that its address names no other tensor meanwhile
    TileGrid grid;                             // the tiling in force when it was built
    uint64_t index;
    std::shared_future<TileData> data;
    uint64_t last_use;
  };
  TilePool pool_;  // before entries_: the tiles they hold go back to it when they are destroyed
  std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

// Never destroyed: the prebuilder's thread may be building a tile when the process exits.
TileCache& tile_cache() {
  static auto* cache = new TileCache;
  return *cache;
}

// Builds, on a thread of its own, the tile a front-to-back reader will need next while the threads serving
// it copy from the current one, so that the reader does not wait for each tile in turn. One build at a
// time; a request while it is busy is dropped (the reader then builds the tile itself), and so is one
// for which the cache has no room without evicting a tile not yet read to its end.
class TilePrebuilder {
 public:
  void request(const std::shared_ptr<const LogicalTensor>& src, uint64_t index, const TileGrid& grid) {
    {
      std::lock_guard lock(mutex_);
      if (busy_ || (src.get() == last_src_ && index == last_index_)) return;
      busy_ = true;
      last_src_ = src.get();  // compared only: a reader asks again on each read past a tile's middle
      last_index_ = index;
      job_ = Job{src, index, grid};
    }
    ready_.notify_one();
  }

 private:
  struct Job {
    std::shared_ptr<const LogicalTensor> src;
    uint64_t index;
    TileGrid grid;
  };
  void run() {
    for (;;) {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return job_.has_value(); });
      const Job job = std::move(*job_);
      job_.reset();
      lock.unlock();
      try {
        tile_cache().get(job.src, job.index, job.grid, Eviction::finished_only);
      } catch (...) {  // not cached: the reader that needs the tile builds it and reports the error
      }
      lock.lock();
      busy_ = false;
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::optional<Job> job_;
  bool busy_ = false;
  const LogicalTensor* last_src_ = nullptr;
  uint64_t last_index_ = 0;
  std::thread thread_{[this] { run(); }};  // last: starts once the members it uses exist
};

// Started at the first read of a transposed tensor (after the daemon has forked), never destroyed.
TilePrebuilder& prebuilder() {
  static auto* p = new TilePrebuilder;
  return *p;
}

}  // namespace

void set_transposed_cache_bytes(uint64_t bytes) { tile_bytes = std::max<uint64_t>(bytes, 1 << 20) / kCacheTiles; }

void read_transposed(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                     std::span<std::byte> out, std::vector<DeferredRun>* deferred) {
  const uint64_t size = dtype_size(tensor.dtype);
  const TileGrid grid(static_cast<uint64_t>(tensor.shape[0]), static_cast<uint64_t>(tensor.shape[1]), size);
  // The tiles this read has taken from the cache: a row crosses every tile of a tile row, and a read of
  // many rows goes back to each many times.
  std::array<std::pair<uint64_t, TileData>, kCacheTiles / 2> taken;
  size_t next_slot = 0;
  const auto take = [&](uint64_t index, bool next_needed) -> const TileData& {
    for (const auto& [i, data] : taken)
      if (data && i == index) return data;
    // A row crossing several tiles needs them all: the next is built meanwhile on the prebuilder's thread.
    if (next_needed) prebuilder().request(source.of, index + 1, grid);
    auto& slot = taken[next_slot++ % taken.size()];
    slot = {index, tile_cache().get(source.of, index, grid)};
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
    const uint64_t n = std::min(end - e, width == grid.cols ? tile_end_row * grid.cols - e : col0 + width - col);
    std::byte* const dst = out.data() + (e - first) * size;
    const std::byte* const src = tile->bytes.get() + ((row % grid.tile_rows) * width + (col - col0)) * size;
    if (deferred != nullptr && n * size >= kMinHeldRun && deferred->size() < kMaxDeferredRuns)
      deferred->push_back({HeldBytes{tile, src}, dst, n * size});
    else
      std::memcpy(dst, src, n * size);
    if (e + n == (tile_end_row - 1) * grid.cols + col0 + width) tile->read_to_end.store(true, std::memory_order_relaxed);
    e += n;
  }
  // A reader past the middle of a tile of whole rows is likely to read the next one soon: build it now.
  const uint64_t last_row = (first + count - 1) / grid.cols;
  if (count > 0 && grid.tiles_across() == 1 && last_row % grid.tile_rows >= grid.tile_rows / 2 &&
      last_row / grid.tile_rows + 1 < (grid.rows + grid.tile_rows - 1) / grid.tile_rows)
    prebuilder().request(source.of, last_row / grid.tile_rows + 1, grid);
}

void build_transposed_ahead(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count) {
  const TileGrid grid(static_cast<uint64_t>(tensor.shape[0]), static_cast<uint64_t>(tensor.shape[1]),
                      dtype_size(tensor.dtype));
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
  prebuilder().request(source.of, row0 / grid.tile_rows * grid.tiles_across() + col0 / grid.tile_cols, grid);
}

void append_transposed_runs(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                            std::vector<Piece>& out) {
  const TileGrid grid(static_cast<uint64_t>(tensor.shape[0]), static_cast<uint64_t>(tensor.shape[1]),
                      dtype_size(tensor.dtype));
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
