// The block cache: an index of fetched ranges per object version, an LRU over them, the GET pool.
//
// What a read fetches: the gaps of its range, rounded out to align_bytes (never over a neighbour), and when
// the read starts where an earlier read of the object ended (a sequential reader) up to the end of the block,
// with the next block read ahead. What a prefetch fetches: the gaps of its range, rounded out to pages.
// Every fetched range is one extent: one GET (or one disk file) of at most block_bytes (a read's never
// crossing a multiple of it), evicted as a whole. Extents of one object never overlap, so two readers of one
// range share one GET.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "ckptfs/s3_cache.hpp"
#include "s3/disk_cache.hpp"
#include "s3/fetch_pool.hpp"

namespace ckptfs::s3 {
namespace {

class ClientReader : public RangeReader {
 public:
  explicit ClientReader(std::shared_ptr<Client> client) : client_(std::move(client)) {}
  void read_range(const ObjectId& o, std::uint64_t offset, std::span<std::byte> dst) override {
    client_->get_range(o.bucket, o.key, offset, dst.size(), o.etag, dst.data());
  }
  std::uint64_t retries() const override { return client_->retries(); }

 private:
  std::shared_ptr<Client> client_;
};

std::string identity_of(const ObjectId& o) {
  return o.bucket + '\0' + o.key + '\0' + o.etag;
}

constexpr std::uint64_t kPage = 4096;

// Makes the pages of a fresh buffer at once, not a fault per page as the GET writes them (a fault costs
// more than clearing the page it brings); best effort (before Linux 5.14, faults as before).
void populate(std::byte* data, std::uint64_t size) {
  const auto first = (reinterpret_cast<std::uintptr_t>(data) + kPage - 1) / kPage * kPage;
  const auto last = (reinterpret_cast<std::uintptr_t>(data) + size) / kPage * kPage;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
}
// Extents smaller than this stay while the small ones hold at most memory_bytes / kSmallShare (or nothing
// else can go): each costs a request to fetch again, whatever its size, and a ZeRO-3 view reads its group
// of norms and biases (a few KiB per rank object) a slice at a time, all through the view.
constexpr std::uint64_t kSmallExtent = 64 << 10;
constexpr std::uint64_t kSmallShare = 32;
// Read ends remembered per object: this many sequential readers of one object are recognised at once.
constexpr std::size_t kStreams = 8;

std::uint64_t round_down(std::uint64_t x, std::uint64_t unit) {
  return x / unit * unit;
}
std::uint64_t round_up(std::uint64_t x, std::uint64_t unit) {
  return (x + unit - 1) / unit * unit;
}

struct Extent {
  enum class State { queued, running, ready, failed };

  ObjectId object;
  std::string identity;
  std::uint64_t begin = 0, end = 0;
  bool cached = true;  // in the index and in memory_used; false: fetched straight into a reader's buffer
  bool from_disk = false;
  std::unique_ptr<std::byte[]> owned;
  std::byte* data = nullptr;  // owned.get(), or the reader's buffer
  State state = State::queued;
  std::exception_ptr error;
  int pins = 0;                  // readers waiting on it or copying from it: never evicted meanwhile
  std::condition_variable done;  // it became ready or failed: its readers wake, not every waiting reader
  bool prefetched_unread = false;
  bool in_lru = false;
  std::list<Extent*>::iterator lru;

  std::uint64_t size() const { return end - begin; }
  bool finished() const { return state == State::ready || state == State::failed; }
};
using ExtentPtr = std::shared_ptr<Extent>;

struct ObjectEntry {
  ObjectId object;
  std::map<std::uint64_t, ExtentPtr> extents;  // by begin, disjoint
  std::array<std::uint64_t, kStreams> read_ends;
  std::size_t next_read_end = 0;
  bool prefetched = false;  // the caller prefetches what it will read: reads fetch no more than they ask
  std::uint64_t bytes_fetched = 0, requests = 0;  // this version's GETs

  ObjectEntry() { read_ends.fill(UINT64_MAX); }
};

// A range of an object not in memory, to be fetched as one extent.
struct Gap {
  std::uint64_t begin, end;
  bool on_disk = false;
};

}  // namespace

std::uint64_t default_memory_bytes() {
  constexpr std::uint64_t kStep = 64ull << 20, kLeast = 256ull << 20, kMost = 1ull << 30;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return kLeast;
  const std::uint64_t sixteenth = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 16;
  return std::clamp(sixteenth / kStep * kStep, kLeast, kMost);
}

std::shared_ptr<RangeReader> client_reader(std::shared_ptr<Client> client) {
  return std::make_shared<ClientReader>(std::move(client));
}

struct BlockCache::Impl {
  enum class Mode { read, prefetch };

  std::shared_ptr<RangeReader> reader;
  BlockCacheOptions options;
  std::optional<DiskCache> disk;

  mutable std::mutex mutex;
  // Every object version read so far (its entry stays when its extents go: a few hundred bytes each).
  std::unordered_map<std::string, ObjectEntry> objects;
  // Ready cached extents, most recently used first: those of kSmallExtent and more, and the small ones.
  std::list<Extent*> lru, small_lru;
  std::uint64_t small_bytes = 0;  // of the extents in small_lru
  std::uint64_t memory_used = 0;
  std::uint64_t prefetch_unread = 0;
  std::atomic<std::uint64_t> bytes_fetched{0}, requests{0}, hits{0}, misses{0}, disk_hits{0};

  FetchPool pool;  // last: its threads stop before the rest goes

  Impl(std::shared_ptr<RangeReader> r, BlockCacheOptions o)
      : reader(std::move(r)), options(std::move(o)), pool(options.connections) {
    if (options.block_bytes == 0 || options.align_bytes == 0 ||
        options.block_bytes % options.align_bytes != 0)
      throw std::invalid_argument(
          "BlockCacheOptions: block_bytes must be a non-zero multiple of align_bytes");
    if (options.dir) disk.emplace(*options.dir, options.dir_bytes);
  }

  // -- with the lock held ----------------------------------------------------------------------------
  ObjectEntry& entry_of(const ObjectId& object, const std::string& identity) {
    auto [it, fresh] = objects.try_emplace(identity);
    if (fresh) it->second.object = object;
    return it->second;
  }

  std::list<Extent*>& lru_of(const Extent& e) { return e.size() < kSmallExtent ? small_lru : lru; }

  void add_to_lru(Extent& e) {
    std::list<Extent*>& list = lru_of(e);
    list.push_front(&e);
    e.lru = list.begin(), e.in_lru = true;
    if (&list == &small_lru) small_bytes += e.size();
  }

  void drop(Extent& e) {
    memory_used -= e.size();
    if (e.in_lru) {
      std::list<Extent*>& list = lru_of(e);
      list.erase(e.lru), e.in_lru = false;
      if (&list == &small_lru) small_bytes -= e.size();
    }
    mark_read(e);
    auto& extents = objects.at(e.identity).extents;
    auto it = extents.find(e.begin);
    if (it != extents.end() && it->second.get() == &e) extents.erase(it);  // may free `e`: last
  }

  void mark_read(Extent& e) {
    if (e.prefetched_unread) prefetch_unread -= e.size(), e.prefetched_unread = false;
  }

  // Evicts the least recently used extent nobody waits on that no prefetch has fetched for a read still to
  // come; for a read, failing that, the least recently used prefetched one (a prefetch evicts none of those).
  bool evict_one(Mode mode) {
    const bool small_first = small_bytes > options.memory_bytes / kSmallShare;
    for (bool unread_too : {false, mode == Mode::read})
      for (std::list<Extent*>* list :
           small_first ? std::array{&small_lru, &lru} : std::array{&lru, &small_lru})
        for (auto it = list->rbegin(); it != list->rend(); ++it) {
          Extent& e = **it;
          if (e.pins == 0 && (unread_too || !e.prefetched_unread)) {
            drop(e);
            return true;
          }
        }
    return false;
  }

  bool reserve(std::uint64_t bytes, Mode mode) {
    if (mode == Mode::prefetch && prefetch_unread + bytes > options.prefetch_share_bytes()) return false;
    while (memory_used + bytes > options.memory_bytes)
      if (!evict_one(mode)) return false;
    memory_used += bytes;
    return true;
  }

  // Whether a read should fetch up to the end of its block: it starts where an earlier read ended (or a
  // little after), and the caller does not prefetch this object itself.
  bool looks_sequential(ObjectEntry& entry, std::uint64_t offset, std::uint64_t end) {
    bool sequential = false;
    for (std::uint64_t e : entry.read_ends)
      if (e != UINT64_MAX && e <= offset && offset <= e + options.align_bytes) sequential = true;
    entry.read_ends[entry.next_read_end++ % kStreams] = end;
    return sequential && !entry.prefetched;
  }

  // The extents of [begin, end) already there (in order), and the gaps to fetch, rounded out to `unit`.
  void find(const ObjectEntry& entry, const ObjectId& object, std::uint64_t begin, std::uint64_t end,
            std::uint64_t unit, bool to_block_end, std::vector<ExtentPtr>& present,
            std::vector<Gap>& gaps) const {
    const auto& extents = entry.extents;
    auto next = extents.upper_bound(begin);
    if (next != extents.begin() && std::prev(next)->second->end > begin) --next;
    std::uint64_t at = begin;
    while (at < end) {
      if (next != extents.end() && next->first <= at) {
        present.push_back(next->second);
        at = next->second->end;
        ++next;
        continue;
      }
      const std::uint64_t floor = next == extents.begin() ? 0 : std::prev(next)->second->end;
      const std::uint64_t ceiling = next == extents.end() ? object.size : next->first;
      const std::uint64_t needed_end = std::min(end, ceiling);
      std::uint64_t hi = round_up(needed_end, unit);
      if (to_block_end) hi = round_up(needed_end, options.block_bytes);
      gaps.push_back({std::max(floor, round_down(at, unit)), std::min(ceiling, hi)});
      at = needed_end;
    }
  }

  // `gap` as extents of at most one block each, from the disk cache where it has them: a read's cut at the
  // multiples of block_bytes (its blocks are those of a sequential reader), a prefetch's into equal parts
  // (its range is what a view needs of the object: cut at a multiple, a range of 5 MiB would be two GETs).
  std::vector<Gap> pieces(const std::string& identity, Gap gap, Mode mode) const {
    std::vector<DiskCache::Segment> segments =
        disk ? disk->cover(identity, gap.begin, gap.end)
             : std::vector{DiskCache::Segment{gap.begin, gap.end, false}};
    std::vector<Gap> out;
    for (const auto& s : segments) {
      const std::uint64_t parts = (s.end - s.begin + options.block_bytes - 1) / options.block_bytes;
      const std::uint64_t part =
          std::min(options.block_bytes, round_up((s.end - s.begin + parts - 1) / parts, kPage));
      for (std::uint64_t at = s.begin; at < s.end;) {
        const std::uint64_t stop =
            std::min(s.end, mode == Mode::read ? round_down(at, options.block_bytes) + options.block_bytes
                                               : at + part);
        out.push_back({at, stop, s.stored});
        at = stop;
      }
    }
    return out;
  }

  ExtentPtr new_extent(const ObjectId& object, const std::string& identity, Gap piece) const {
    auto e = std::make_shared<Extent>();
    e->object = object;
    e->identity = identity;
    e->begin = piece.begin, e->end = piece.end;
    e->from_disk = piece.on_disk;
    return e;
  }

  void submit(const ExtentPtr& e, Mode mode) {
    pool.submit(mode == Mode::read ? FetchPool::Priority::read : FetchPool::Priority::prefetch,
                [this, e] { fetch(e); });
  }

  // Starts fetching the gaps of [begin, end) in the background, in order, as far as the prefetch share and
  // memory allow: the rest is dropped.
  void start_prefetch(ObjectEntry& entry, const ObjectId& object, const std::string& identity,
                      std::uint64_t begin, std::uint64_t end) {
    std::vector<ExtentPtr> present;
    std::vector<Gap> gaps;
    // A prefetch's caller knows what it will read, range by range: rounded out to align_bytes, each range's
    // ends would fetch bytes of its neighbours again once the extents holding them were read and evicted
    // (a small cache, a view's window refilled in steps of a few pages per object).
    find(entry, object, begin, end, std::min(options.align_bytes, kPage), false, present, gaps);
    for (Gap gap : gaps)
      for (Gap piece : pieces(identity, gap, Mode::prefetch)) {
        ExtentPtr e = new_extent(object, identity, piece);
        if (!reserve(e->size(), Mode::prefetch)) return;
        e->prefetched_unread = true;
        prefetch_unread += e->size();
        entry.extents.emplace(e->begin, e);
        submit(e, Mode::prefetch);
      }
  }

  // -- in a worker -----------------------------------------------------------------------------------
  void fetch(const ExtentPtr& e) {
    {
      std::lock_guard lock(mutex);
      if (e->state != Extent::State::queued) return;  // a reader's copy of a queued prefetch ran first
      e->state = Extent::State::running;
    }
    bool loaded = false;
    try {
      if (e->cached) {
        e->owned = std::make_unique_for_overwrite<std::byte[]>(e->size());
        e->data = e->owned.get();
        populate(e->data, e->size());
      }
      std::span<std::byte> bytes(e->data, e->size());
      loaded = e->from_disk && disk->load(e->identity, e->begin, bytes);
      if (loaded) {
        disk_hits++;
      } else {
        requests++;
        reader->read_range(e->object, e->begin, bytes);
        bytes_fetched += bytes.size();
      }
      std::lock_guard lock(mutex);
      if (!loaded) {
        ObjectEntry& entry = objects.at(e->identity);
        entry.requests++, entry.bytes_fetched += e->size();
      }
      e->state = Extent::State::ready;
      if (e->cached) add_to_lru(*e);
    } catch (...) {
      std::lock_guard lock(mutex);
      e->state = Extent::State::failed;
      e->error = std::current_exception();
      e->owned.reset();
      if (e->cached) drop(*e);
    }
    e->done.notify_all();
    // The bytes stay valid: `e` holds them even if evicted meanwhile, and a ready extent is never written.
    if (e->state == Extent::State::ready && e->cached && disk && !loaded)
      disk->store(e->identity, e->begin, std::span<const std::byte>(e->data, e->size()));
  }
};

BlockCache::BlockCache(std::shared_ptr<Client> client, BlockCacheOptions options)
    : BlockCache(client_reader(std::move(client)), std::move(options)) {}

BlockCache::BlockCache(std::shared_ptr<RangeReader> reader, BlockCacheOptions options)
    : impl_(std::make_unique<Impl>(std::move(reader), std::move(options))) {}

BlockCache::~BlockCache() = default;

bool BlockCache::read(const ObjectId& object, std::uint64_t offset, std::span<std::byte> dst, ReadKind kind) {
  const std::uint64_t end = offset + dst.size();
  if (end > object.size || end < offset)
    throw SourceError(fmt::format("s3://{}/{}: read of {} bytes at {} past the end of the object ({} bytes)",
                                  object.bucket, object.key, dst.size(), offset, object.size));
  if (dst.empty()) return true;
  Impl& m = *impl_;
  const std::string identity = identity_of(object);
  std::vector<ExtentPtr> parts;  // every extent the read copies from, pinned
  std::unique_lock lock(m.mutex);
  {
    std::vector<ExtentPtr> present;
    std::vector<Gap> gaps;
    ObjectEntry& entry = m.entry_of(object, identity);
    const bool sequential = kind == ReadKind::stream && m.looks_sequential(entry, offset, end);
    m.find(entry, object, offset, end, m.options.align_bytes, sequential, present, gaps);
    if (kind == ReadKind::cached && !gaps.empty()) return false;
    for (const ExtentPtr& e : present) {
      e->pins++;
      m.mark_read(*e);
      if (e->state == Extent::State::queued) m.submit(e, Impl::Mode::read);  // ahead of the prefetches
    }
    m.hits += present.size();
    parts = std::move(present);
    for (Gap gap : gaps)
      for (Gap piece : m.pieces(identity, gap, Impl::Mode::read)) {
        ExtentPtr e = m.new_extent(object, identity, piece);
        e->pins = 1;
        if (m.reserve(e->size(), Impl::Mode::read)) {
          entry.extents.emplace(e->begin, e);
        } else {  // memory is full of what readers wait on: fetch the bytes needed straight into dst,
                  // uncached
          e->cached = false;
          e->begin = std::max(e->begin, offset), e->end = std::min(e->end, end);
          e->data = dst.data() + (e->begin - offset);
        }
        m.misses++;
        m.submit(e, Impl::Mode::read);
        parts.push_back(e);
      }
    if (sequential) {  // read ahead: the next block, so that a sequential reader never waits for a whole GET
      std::uint64_t next = round_up(end, m.options.block_bytes);
      m.start_prefetch(entry, object, identity, next, std::min(object.size, next + m.options.block_bytes));
    }
  }
  // Every part must be finished before returning, even on failure: a worker may still write into dst.
  for (const ExtentPtr& e : parts) e->done.wait(lock, [&] { return e->finished(); });
  std::exception_ptr error;
  for (const ExtentPtr& e : parts)
    if (e->state == Extent::State::failed && !error) error = e->error;
  lock.unlock();
  if (!error)
    for (const ExtentPtr& e : parts)
      if (e->cached) {
        std::uint64_t from = std::max(e->begin, offset), to = std::min(e->end, end);
        std::memcpy(dst.data() + (from - offset), e->data + (from - e->begin), to - from);
      }
  lock.lock();
  // An extent read to its end is what a sequential reader is done with: it goes first (a reader going through
  // many objects at once would otherwise see the cache evict the prefetched extents it has yet to reach,
  // least recently used, before the ones it finished).
  for (const ExtentPtr& e : parts) {
    e->pins--;
    if (e->in_lru) {
      std::list<Extent*>& list = m.lru_of(*e);
      list.splice(end >= e->end ? list.end() : list.begin(), list, e->lru);
    }
  }
  lock.unlock();
  if (error) std::rethrow_exception(error);
  return true;
}

void BlockCache::prefetch(const ObjectId& object, std::uint64_t offset, std::uint64_t length) {
  const std::uint64_t end = std::min(object.size, offset + std::min(length, object.size));
  if (offset >= end) return;
  Impl& m = *impl_;
  const std::string identity = identity_of(object);
  std::lock_guard lock(m.mutex);
  ObjectEntry& entry = m.entry_of(object, identity);
  entry.prefetched = true;
  m.start_prefetch(entry, object, identity, offset, end);
}

std::vector<ObjectFetchStats> BlockCache::object_stats() const {
  const Impl& m = *impl_;
  std::vector<ObjectFetchStats> out;
  std::lock_guard lock(m.mutex);
  for (const auto& [identity, entry] : m.objects)
    out.push_back(
        {entry.object.bucket, entry.object.key, entry.object.etag, entry.bytes_fetched, entry.requests});
  return out;
}

BlockCacheStats BlockCache::stats() const {
  const Impl& m = *impl_;
  BlockCacheStats s;
  s.bytes_fetched = m.bytes_fetched, s.requests = m.requests, s.hits = m.hits, s.misses = m.misses,
  s.disk_hits = m.disk_hits, s.retries = m.reader->retries();
  std::lock_guard lock(m.mutex);
  s.memory_bytes = m.memory_used;
  s.disk_bytes = m.disk ? m.disk->bytes() : 0;
  return s;
}

}  // namespace ckptfs::s3
