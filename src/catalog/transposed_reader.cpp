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
// (128 MiB by default, -o transpose_cache_mb) and one more tile buffer, a band and a span buffer per
// building thread, and tiles evicted while a reply or a thread still reads them.
#include "catalog/transposed_reader.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "catalog/dtype_convert.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckptfs::catalog {

namespace {

constexpr size_t kCacheTiles = 8;
std::atomic<uint64_t> tile_bytes = kDefaultTransposedCacheBytes / kCacheTiles;
constexpr uint64_t kMinTileRows = 64;  // a tile is at least this many output rows when rows are very long
constexpr uint64_t kBandBytes = uint64_t{1} << 20;     // the source elements a band gathers (fits L2)
constexpr uint64_t kSpanBytes = uint64_t{1} << 20;     // the most one coalesced read spans
constexpr uint64_t kMaxGapBytes = uint64_t{16} << 10;  // unneeded bytes read rather than one more pread
constexpr uint64_t kBlock = 32;  // the source rows a pass of the transpose covers (64 B of a bf16 output row)

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
  // The grid of a transposed tensor.
  explicit TileGrid(const LogicalTensor& tensor)
      : TileGrid(static_cast<uint64_t>(tensor.shape[0]), static_cast<uint64_t>(tensor.shape[1]),
                 dtype_size(tensor.dtype)) {}
  uint64_t rows, cols;  // of the tensor
  uint64_t tile_rows, tile_cols;
  TileGrid(uint64_t rows_, uint64_t cols_, uint64_t size)
      : rows(std::max<uint64_t>(rows_, 1)), cols(std::max<uint64_t>(cols_, 1)) {
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
void transpose_scalar(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
                      uint64_t n_k, uint64_t n_i) {
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

// The blocks of kMicro x kMicro elements through `kernel`, the edges element by element. Each kMicro output
// rows take all n_k source rows in turn: the n_k lines of the band they read stay in L1 for the next
// kMicro, and each output row is written n_k elements at a stretch (whole cache lines): about 1.5x the rate
// of passes of kBlock source rows over the band's whole width (measured on bf16 column tiles).
template <size_t kSize, uint64_t kMicro, auto kernel>
void transpose_simd(const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
                    uint64_t n_k, uint64_t n_i) {
  const uint64_t k_main = n_k / kMicro * kMicro, i_main = n_i / kMicro * kMicro;
  for (uint64_t i = 0; i < i_main; i += kMicro)
    for (uint64_t k = 0; k < k_main; k += kMicro)
      kernel(src + (k * src_stride + i) * kSize, src_stride * kSize, dst + (i * dst_stride + k) * kSize,
             dst_stride * kSize);
  transpose_scalar<kSize>(src + k_main * src_stride * kSize, src_stride, dst + k_main * kSize, dst_stride,
                          n_k - k_main, n_i);
  transpose_scalar<kSize>(src + i_main * kSize, src_stride, dst + i_main * dst_stride * kSize, dst_stride,
                          k_main, n_i - i_main);
}
#endif

void transpose(uint64_t size, const std::byte* src, uint64_t src_stride, std::byte* dst, uint64_t dst_stride,
               uint64_t n_k, uint64_t n_i) {
  switch (size) {
    case 1:
      return transpose_scalar<1>(src, src_stride, dst, dst_stride, n_k, n_i);
#if defined(__SSE2__)
    case 2:
      return transpose_simd<2, 8, transpose_8x8_16>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4:
      return transpose_simd<4, 4, transpose_4x4_32>(src, src_stride, dst, dst_stride, n_k, n_i);
#else
    case 2:
      return transpose_scalar<2>(src, src_stride, dst, dst_stride, n_k, n_i);
    case 4:
      return transpose_scalar<4>(src, src_stride, dst, dst_stride, n_k, n_i);
#endif
    case 8:
      return transpose_scalar<8>(src, src_stride, dst, dst_stride, n_k, n_i);
    default:
      throw std::logic_error("a transpose of elements of " + std::to_string(size) +
                             " bytes");  // validate refuses them
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
    if (!runs_place_elements(src)) {  // a transposed source: read row by row
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
      return band.subspan(((p.dst_begin / cols - row0) * width + p.dst_begin % cols - col0) * size,
                          p.count * size);
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
// buffer costs 4,096 page faults and as many pages cleared by the kernel (in a virtual machine, often the
// host's faults too: the largest cost of a first read). Every buffer has the capacity of the largest tile,
// so that any spare fits any tile. A buffer given back is kept while the buffers in use and kept number
// at most kCacheTiles + 1 (the cache's tiles and one being built), so memory stays bounded. (Transparent
// huge pages were tried: fewer faults, but a first read 1.3x slower in a VM, whose host backs fresh huge
// pages on first touch.)
class TilePool {
 public:
  TilePool() { spares_.reserve(kMostBuffers); }  // give_back, in a deleter, must not throw
  // A buffer of at least `bytes` (contents unspecified: the tile writes every byte) that returns here
  // when its last holder drops it.
  std::shared_ptr<std::byte[]> take(uint64_t bytes) {
    Buffer buffer;
    uint64_t capacity = std::max(bytes, tile_bytes.load(std::memory_order_relaxed));
    {
      std::lock_guard lock(mutex_);
      const auto it =
          std::find_if(spares_.begin(), spares_.end(), [&](const Spare& s) { return s.capacity >= bytes; });
      if (it != spares_.end()) {
        buffer = std::move(it->buffer);
        capacity = it->capacity;
        spares_.erase(it);
      }
      ++in_use_;
    }
    if (!buffer) buffer = fresh_buffer(capacity);
    // The tile's pages made at once, not a fault per page; best effort (before Linux 5.14: faults).
    ::madvise(buffer.get(), (bytes + 4095) / 4096 * 4096, MADV_POPULATE_WRITE);
    return {buffer.release(),
            [this, capacity](std::byte* p) { give_back(Buffer(p, Unmap{capacity}), capacity); }};
  }

 private:
  static constexpr size_t kMostBuffers = kCacheTiles + 1;
  struct Unmap {
    uint64_t bytes;
    void operator()(std::byte* p) const { ::munmap(p, bytes); }
  };
  using Buffer = std::unique_ptr<std::byte[], Unmap>;
  static Buffer fresh_buffer(uint64_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return Buffer(static_cast<std::byte*>(p), Unmap{bytes});
  }
  struct Spare {
    Buffer buffer;
    uint64_t capacity;
  };
  void give_back(Buffer buffer, uint64_t capacity) {
    std::lock_guard lock(mutex_);
    --in_use_;
    if (in_use_ + spares_.size() < kMostBuffers) spares_.push_back({std::move(buffer), capacity});
  }
  std::mutex mutex_;
  std::vector<Spare> spares_;
  size_t in_use_ = 0;
};

// Output rows [row0, row0 + n_rows) x columns [col0, col0 + n_cols) of the transpose of `src` ([R, C]),
// row-major with stride n_cols.
TileData build_tile(const LogicalTensor& src, uint64_t row0, uint64_t n_rows, uint64_t col0, uint64_t n_cols,
                    TilePool& pool) {
  const uint64_t size = dtype_size(src.dtype);
  auto tile = std::make_shared<Tile>();
  tile->size = n_rows * n_cols * size;
  tile->bytes = pool.take(tile->size);
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
    uint64_t serial = 0;
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
        serial = clock_;
        entries_.push_back({src, grid, index, promise.get_future().share(), clock_, serial});
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
      std::erase_if(entries_, [&](const Entry& e) { return e.serial == serial; });
      throw;
    }
  }

 private:
  struct Entry {
    std::shared_ptr<const LogicalTensor> src;  // held, so that its address names no other tensor meanwhile
    TileGrid grid;                             // the tiling in force when it was built
    uint64_t index;
    std::shared_future<TileData> data;
    uint64_t last_use;
    uint64_t serial;  // this entry's own, apart from a later one of the same tile
  };
  // Under mutex_, before a new tile: a tile read to its end (a front-to-back reader has passed it) goes
  // first, full or not, so that its buffer serves the new tile instead of fresh memory (which the kernel
  // clears page by page); else, when the cache is full, the least recently used built tile if `eviction`
  // allows. A tile being built is never evicted (its builder would build it twice over): with every tile
  // in the cache being built, a reader's tile goes in beyond the count (by at most the building threads).
  // False when there is no room.
  bool make_room(Eviction eviction) {
    const auto built = [](const Entry& e) {
      return e.data.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    };
    const auto finished = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
      if (!built(e)) return false;
      try {
        return e.data.get()->read_to_end();
      } catch (...) {
        return true;  // a failed build, about to be erased by its builder
      }
    });
    if (finished != entries_.end()) {
      entries_.erase(finished);
      return true;
    }
    if (entries_.size() < kCacheTiles) return true;
    if (eviction == Eviction::finished_only) return false;
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (built(*it) && (oldest == entries_.end() || it->last_use < oldest->last_use)) oldest = it;
    if (oldest != entries_.end()) entries_.erase(oldest);
    return true;
  }
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
      if (busy_ || (index == last_index_ && !src.owner_before(last_src_) && !last_src_.owner_before(src)))
        return;
      busy_ = true;
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
      bool built = false;
      try {
        built = tile_cache().get(job.src, job.index, job.grid, Eviction::finished_only) != nullptr;
      } catch (...) {  // not cached: the reader that needs the tile builds it and reports the error
      }
      lock.lock();
      busy_ = false;
      if (built) {  // a reader asks again on each read past a tile's middle: the cache has it now
        last_src_ = job.src;
        last_index_ = job.index;
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::optional<Job> job_;
  bool busy_ = false;
  // Compared by owner: unlike an address, a control block this still holds is not reused by a later tensor.
  std::weak_ptr<const LogicalTensor> last_src_;
  uint64_t last_index_ = 0;
  std::thread thread_{[this] { run(); }};  // last: starts once the members it uses exist
};

// Started at the first read of a transposed tensor (after the daemon has forked), never destroyed.
TilePrebuilder& prebuilder() {
  static auto* p = new TilePrebuilder;
  return *p;
}

}  // namespace

void set_transposed_cache_bytes(uint64_t bytes) {
  tile_bytes = std::max<uint64_t>(bytes, 1 << 20) / kCacheTiles;
}

void read_transposed(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                     std::span<std::byte> out, std::vector<DeferredRun>* deferred) {
  const uint64_t size = dtype_size(tensor.dtype);
  const TileGrid grid(tensor);
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
    prebuilder().request(source.of, last_row / grid.tile_rows + 1, grid);
}

void build_transposed_ahead(const LogicalTensor& tensor, const Transposed& source, uint64_t first,
                            uint64_t count) {
  const TileGrid grid(tensor);
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

void append_transposed_runs(const LogicalTensor& tensor, const Transposed& source, uint64_t first,
                            uint64_t count, std::vector<Piece>& out) {
  const TileGrid grid(tensor);
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
