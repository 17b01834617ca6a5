// A transposed tensor's tiles, built in bands of source rows: the band's runs (one per source row and shard,
// from the source's own planner) are sorted by file and offset and read in spans of at most kSpanBytes that
// take in the gaps between runs up to kMaxGapBytes (a gap is cheaper to read than a pread), so a tile over a
// tensor-parallel source costs a few large reads per shard, never one per row or element. Each band
// (kBandBytes, cache-resident) is transposed into the tile (transpose_kernels.hpp). The last kTiles tiles
// are kept for every thread reading through the cache (a front-to-back read builds each tile once,
// whichever threads serve it), and the next tile a reader needs is built meanwhile on a thread of its own
// (Prebuilder).
#include "catalog/transposed_tile_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <thread>

#include "catalog/dtype_convert.hpp"
#include "catalog/transpose_kernels.hpp"

namespace ckptfs::catalog {

namespace {

constexpr uint64_t kMinTileRows = 64;  // a tile is at least this many output rows when rows are very long
constexpr uint64_t kBandBytes = uint64_t{1} << 20;     // the source elements a band gathers (fits L2)
constexpr uint64_t kSpanBytes = uint64_t{1} << 20;     // the most one coalesced read spans
constexpr uint64_t kMaxGapBytes = uint64_t{16} << 10;  // unneeded bytes read rather than one more pread

// `extent` cut into equal parts of at most `most` (the last one shorter by less than the part count).
uint64_t balanced_part(uint64_t extent, uint64_t most) {
  const uint64_t parts = (extent + most - 1) / most;
  return (extent + parts - 1) / parts;
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

}  // namespace

// Tile buffers given back by the last reader of an evicted tile, kept for the next tile: a fresh 16 MiB
// buffer costs 4,096 page faults and as many pages cleared by the kernel (in a virtual machine, often the
// host's faults too: the largest cost of a first read). Every buffer has the capacity of the largest tile,
// so that any spare fits any tile. A buffer given back is kept while the buffers in use and kept number
// at most TransposeCache::kTiles + 1 (the cache's tiles and one being built), so memory stays bounded.
// (Transparent huge pages were tried: fewer faults, but a first read 1.3x slower in a VM, whose host backs
// fresh huge pages on first touch.)
class TilePool : public std::enable_shared_from_this<TilePool> {
 public:
  // The spares' room reserved: give_back, in a deleter, must not throw.
  explicit TilePool(uint64_t tile_bytes) : tile_bytes_(tile_bytes) { spares_.reserve(kMostBuffers); }
  // A buffer of at least `bytes` (contents unspecified: the tile writes every byte) that returns here
  // when its last holder drops it.
  std::shared_ptr<std::byte[]> take(uint64_t bytes) {
    Buffer buffer;
    uint64_t capacity = std::max(bytes, tile_bytes_);
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
    return {buffer.release(), [pool = shared_from_this(), capacity](std::byte* p) {
              pool->give_back(Buffer(p, Unmap{capacity}), capacity);
            }};
  }

 private:
  static constexpr size_t kMostBuffers = TransposeCache::kTiles + 1;
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
  uint64_t tile_bytes_;  // every buffer's capacity at least
  std::mutex mutex_;
  std::vector<Spare> spares_;
  size_t in_use_ = 0;
};

namespace {

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
  if (band_rows > kTransposeBlock) band_rows = band_rows / kTransposeBlock * kTransposeBlock;
  for (uint64_t r = 0; r < n_cols; r += band_rows) {  // source rows col0 + r ...
    const uint64_t n = std::min(band_rows, n_cols - r);
    band.resize(n * n_rows * size);
    reader.read(src, col0 + r, n, row0, n_rows, band);
    transpose(size, band.data(), n_rows, tile->bytes.get() + r * size, n_cols, n, n_rows);
  }
  return tile;
}

}  // namespace

TileGrid::TileGrid(uint64_t rows_, uint64_t cols_, uint64_t size, uint64_t tile_bytes)
    : rows(std::max<uint64_t>(rows_, 1)), cols(std::max<uint64_t>(cols_, 1)) {
  const uint64_t most = tile_bytes / size;
  if (rows <= most && (cols + most / rows - 1) / (most / rows) <= TransposeCache::kTiles / 2) {
    tile_rows = rows;
    tile_cols = balanced_part(cols, most / rows);
    return;
  }
  tile_cols = balanced_part(cols, std::max<uint64_t>(1, most / kMinTileRows));
  tile_rows = balanced_part(rows, std::max<uint64_t>(1, most / tile_cols));
}

// Builds, on a thread of its own, the tile a front-to-back reader will need next while the threads serving
// it copy from the current one, so that the reader does not wait for each tile in turn. One build at a
// time; a request while it is busy is dropped (the reader then builds the tile itself), and so is one
// for which the cache has no room without evicting a tile not yet read to its end. The thread starts at
// the first request (in a mount, after the daemon has forked).
class TransposeCache::Prebuilder {
 public:
  explicit Prebuilder(TransposeCache& cache) : cache_(cache) {}
  ~Prebuilder() {
    {
      std::lock_guard lock(state_->mutex);
      state_->stop = true;
    }
    state_->ready.notify_one();
    if (!thread_.joinable()) return;
    // The thread's job may have held the last reference to the cache (a source transposed through it
    // too): the cache is then going on that thread, which leaves by itself once it sees `stop`.
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }

  void request(const std::shared_ptr<const LogicalTensor>& src, uint64_t index, const TileGrid& grid) {
    {
      std::lock_guard lock(state_->mutex);
      if (state_->busy || (index == state_->last_index && !src.owner_before(state_->last_src) &&
                           !state_->last_src.owner_before(src)))
        return;
      state_->busy = true;
      state_->job = Job{src, index, grid};
      if (!thread_.joinable()) thread_ = std::thread(run, state_, &cache_);
    }
    state_->ready.notify_one();
  }

 private:
  struct Job {
    std::shared_ptr<const LogicalTensor> src;
    uint64_t index;
    TileGrid grid;
  };
  // Shared with the thread, which may outlive the Prebuilder (see its destructor).
  struct State {
    std::mutex mutex;
    std::condition_variable ready;
    std::optional<Job> job;
    bool busy = false;
    bool stop = false;
    // Compared by owner: unlike an address, a control block this still holds is not reused by a later
    // tensor.
    std::weak_ptr<const LogicalTensor> last_src;
    uint64_t last_index = 0;
  };
  static void run(const std::shared_ptr<State> state, TransposeCache* cache) {
    for (;;) {
      std::unique_lock lock(state->mutex);
      state->ready.wait(lock, [&] { return state->job.has_value() || state->stop; });
      if (state->stop) return;
      std::optional<Job> job = std::move(state->job);
      state->job.reset();
      lock.unlock();
      bool built = false;
      try {
        built = cache->get(job->src, job->index, job->grid, Eviction::finished_only) != nullptr;
      } catch (...) {  // not cached: the reader that needs the tile builds it and reports the error
      }
      const std::weak_ptr<const LogicalTensor> src = job->src;
      const uint64_t index = job->index;
      job.reset();  // perhaps the cache's last holder: the cache is then gone, and `stop` set
      lock.lock();
      state->busy = false;
      if (built) {  // a reader asks again on each read past a tile's middle: the cache has it now
        state->last_src = src;
        state->last_index = index;
      }
    }
  }

  TransposeCache& cache_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

TransposeCache::TransposeCache(uint64_t bytes)
    : tile_bytes_(std::max<uint64_t>(bytes, 1 << 20) / kTiles),
      pool_(std::make_shared<TilePool>(tile_bytes_)),
      prebuilder_(std::make_unique<Prebuilder>(*this)) {}

TransposeCache::~TransposeCache() = default;

TileGrid TransposeCache::grid(const LogicalTensor& tensor) const {
  return TileGrid(static_cast<uint64_t>(tensor.shape[0]), static_cast<uint64_t>(tensor.shape[1]),
                  dtype_size(tensor.dtype), tile_bytes_);
}

TileData TransposeCache::get(const std::shared_ptr<const LogicalTensor>& src, uint64_t index,
                             const TileGrid& grid, Eviction eviction) {
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
                               std::min(grid.tile_cols, grid.cols - col0), *pool_);
    promise.set_value(tile);
    return tile;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard lock(mutex_);  // a failed read is retried by the next request
    std::erase_if(entries_, [&](const Entry& e) { return e.serial == serial; });
    throw;
  }
}

// Under mutex_, before a new tile: a tile read to its end (a front-to-back reader has passed it) goes
// first, full or not, so that its buffer serves the new tile instead of fresh memory (which the kernel
// clears page by page); else, when the cache is full, the least recently used built tile if `eviction`
// allows. A tile being built is never evicted (its builder would build it twice over): with every tile
// in the cache being built, a reader's tile goes in beyond the count (by at most the building threads).
// False when there is no room.
bool TransposeCache::make_room(Eviction eviction) {
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
  if (entries_.size() < kTiles) return true;
  if (eviction == Eviction::finished_only) return false;
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (built(*it) && (oldest == entries_.end() || it->last_use < oldest->last_use)) oldest = it;
  if (oldest != entries_.end()) entries_.erase(oldest);
  return true;
}

void TransposeCache::build_ahead(const std::shared_ptr<const LogicalTensor>& src, uint64_t index,
                                 const TileGrid& grid) {
  prebuilder_->request(src, index, grid);
}

std::shared_ptr<TransposeCache> make_transpose_cache(uint64_t bytes) {
  return std::make_shared<TransposeCache>(bytes);
}

}  // namespace ckptfs::catalog
