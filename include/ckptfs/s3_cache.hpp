// The block cache of remote objects (issue 19): every read of an object in the store goes through it. It
// keeps recently read byte ranges in memory (bounded, LRU), optionally on a local disk (bounded, reused
// across mounts, verified by ETag), and fetches what is missing with a bounded pool of parallel range GETs,
// each pinned to the object's ETag. The rules (what a read fetches, what prefetch holds) are in docs/s3.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/s3.hpp"

namespace ckptfs::s3 {

// One version of one object: cached bytes are keyed by all of it, so a replaced object (new ETag) never
// serves the old bytes.
struct ObjectId {
  std::string bucket;
  std::string key;
  std::string etag;  // as the store sent it, quotes included; every GET carries If-Match with it
  std::uint64_t size = 0;
};

inline ObjectId object_id(const std::string& bucket, const ObjectInfo& info) {
  return {bucket, info.key, info.etag, info.size};
}

// The in-memory cache's default: a 16th of the machine's memory, from 256 MiB to 1 GiB (a multiple of 64
// MiB): 512 MiB on an 8 GiB laptop, 1 GiB from 16 GiB up. A larger cache is a longer prefetch window over
// rank objects, and so fewer, larger GETs (at 64 ranks the fp32 view in ~600 GETs at 1 GiB, ~1,100 at 512
// MiB).
std::uint64_t default_memory_bytes();

struct BlockCacheOptions {
  std::uint64_t memory_bytes = default_memory_bytes();  // -o cache_mb=N: memory, GETs in flight included
  std::uint64_t block_bytes = 8ull << 20;    // the largest GET; a read's never crosses a multiple of it
  std::uint64_t align_bytes = 64ull << 10;   // every fetched range is rounded out to multiples of this
  std::size_t connections = 16;              // -o s3_connections=N: the most GETs in flight at once
  std::optional<std::filesystem::path> dir;  // -o cache_dir=DIR: the on-disk cache (none when unset)
  std::uint64_t dir_bytes = 8ull << 30;      // -o cache_dir_mb=N: its bound

  // How much of memory_bytes prefetched, not yet read bytes may hold (a prefetch past it is dropped): the
  // rest keeps what reads fetched and what was read recently.
  std::uint64_t prefetch_share_bytes() const { return memory_bytes / 4 * 3; }
};

struct BlockCacheStats {
  std::uint64_t bytes_fetched = 0;  // bytes received by the cache's GETs
  std::uint64_t requests = 0;       // range GETs the cache sent (failed ones included, retries not)
  std::uint64_t retries = 0;        // the store client's retries (all its requests, not only the cache's)
  std::uint64_t hits = 0;           // pieces of reads found in memory (or already being fetched)
  std::uint64_t misses = 0;         // pieces of reads fetched from the store
  std::uint64_t disk_hits = 0;      // pieces of reads and prefetches loaded from the disk cache
  std::uint64_t memory_bytes = 0;   // bytes held in memory now (pending GETs included)
  std::uint64_t disk_bytes = 0;     // bytes held in the disk cache now
};

// What the cache fetched of one object version (bytes fetched per source, for ckptfs.json).
struct ObjectFetchStats {
  std::string bucket, key, etag;
  std::uint64_t bytes_fetched = 0;
  std::uint64_t requests = 0;  // its GETs that succeeded (BlockCacheStats::requests counts failed ones too)
};

// The counters as JSON, under their field names (ckptfs-stats.json, the probe's `stats`); an object's
// entry names its key and ETag, not the bucket (the source it belongs to names it).
void to_json(nlohmann::json& out, const BlockCacheStats& stats);
void to_json(nlohmann::json& out, const ObjectFetchStats& stats);

// Where the cache's bytes come from: the store in the product (`client_reader`), a fake in tests.
class RangeReader {
 public:
  virtual ~RangeReader() = default;
  // Exactly dst.size() bytes of `object` at `offset`, pinned to object.etag (ObjectChangedError when it was
  // replaced), or an exception. Called from several threads at once.
  virtual void read_range(const ObjectId& object, std::uint64_t offset, std::span<std::byte> dst) = 0;
  virtual std::uint64_t retries() const { return 0; }
};

std::shared_ptr<RangeReader> client_reader(std::shared_ptr<Client> client);

class BlockCache {
 public:
  BlockCache(std::shared_ptr<Client> client, BlockCacheOptions options);
  BlockCache(std::shared_ptr<RangeReader> reader, BlockCacheOptions options);
  // Waits for the GETs in flight (each ends within the client's bounded retry time); queued ones are dropped.
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // Exactly dst.size() bytes of the object at offset: cached ranges are copied, the missing ones fetched (in
  // parallel, at most `connections` GETs in flight), each pinned with If-Match. Errors of the GETs propagate
  // (ObjectChangedError, s3::Error) and nothing failed is cached: a later read fetches again. Readers wanting
  // the same range wait for one GET. A read past the object's end is a SourceError. A probe (a few header
  // bytes checked before the bytes after them are served) is no step of a reader: it is neither the end of a
  // sequential read nor a reason to read ahead. A `cached` read fetches nothing: it returns false, having
  // copied nothing, unless every byte is there or on its way (a view's small read of what it prefetched).
  enum class ReadKind { stream, probe, cached };
  bool read(const ObjectId& object, std::uint64_t offset, std::span<std::byte> dst,
            ReadKind kind = ReadKind::stream);
  // Starts fetching [offset, offset + length) in the background and returns at once. Bounded: the bytes
  // prefetched and not yet read stay under prefetch_share_bytes() (the rest of the range is dropped: call
  // again as the reader advances), and a prefetch never evicts what a reader is waiting on or another
  // prefetch's unread bytes. Errors are not reported here: the read that wants those bytes fetches again.
  void prefetch(const ObjectId& object, std::uint64_t offset, std::uint64_t length);

  BlockCacheStats stats() const;
  // One entry per object version read or prefetched so far, in no particular order.
  std::vector<ObjectFetchStats> object_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptfs::s3
