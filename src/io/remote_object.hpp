// The reads of one object of an object store: every byte a remote File serves comes through fetch(), from
// the source's block cache (s3_cache.hpp: bounded memory, an optional disk cache, a bounded pool of
// parallel ranged GETs, each pinned to the ETag the listing showed), and prefetch() hands it the ranges a
// sequential reader will want. Small reads (the parsing of a torch.save: magic, zip end records, central
// directory, local headers, data.pkl) go through two read-ahead blocks of the File, the object's suffix
// and the block last read elsewhere, so that a parse costs a few requests instead of one per read.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/io.hpp"
#include "ckptfs/s3.hpp"
#include "ckptfs/s3_cache.hpp"

namespace ckptfs::io {

// The block cache of one object-store source, over its store (`reader`: the client's, s3::client_reader,
// or a fake in tests), made with the options of the Runtime that opened the source at its first use.
// The mount forks into the background once it has parsed its sources, and the cache's fetch threads do not
// follow a fork: the Runtime tells it (forked()) right after, and the next read makes a new one.
class RemoteCache {
 public:
  RemoteCache(std::shared_ptr<s3::RangeReader> reader, s3::BlockCacheOptions options)
      : reader_(std::move(reader)), options_(std::move(options)) {}
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;
  s3::BlockCache& get() const;
  // In the child of a fork: the cache made before it is left as it is, never destroyed (joining its fetch
  // threads would wait for threads that do not exist here).
  void forked();
  // {fetched: bytes, requests, retries, hits, misses, disk_hits, memory_bytes, disk_bytes, objects: [...]}
  // for ckptfs-stats.json; all zero before the first read.
  nlohmann::json figures() const;

 private:
  std::shared_ptr<s3::RangeReader> reader_;
  s3::BlockCacheOptions options_;
  mutable std::mutex mutex_;
  mutable s3::BlockCache* cache_ = nullptr;  // owned, but leaked by forked()
};

// Reads at most this long go through the read-ahead blocks. A read within the last kReadAheadSuffix bytes
// of the object fetches all of them once (the zip end records, at most 64 KiB + 42 bytes, and the central
// directory of a torch.save in one request); another read that misses fetches kReadAheadBlock bytes from
// its offset on (a local header and its name, often the next few small records).
inline constexpr uint64_t kSmallRemoteRead = uint64_t{128} << 10;
inline constexpr uint64_t kReadAheadBlock = uint64_t{4} << 10;
inline constexpr uint64_t kReadAheadSuffix = uint64_t{128} << 10;

class RemoteReader {
 public:
  RemoteReader(std::shared_ptr<const RemoteCache> cache, std::string bucket, s3::ObjectInfo info);

  // Exactly dst.size() bytes at `offset` (within the object). Throws SourceError naming the object: an
  // s3::Error, or "changed since the mount" when the store no longer has the ETag listed.
  void read(uint64_t offset, std::span<std::byte> dst) const;
  // A hint that [offset, offset + length) will be read: the block cache starts fetching it (from the
  // pieces of an expectation guarding it, when they lie just before).
  void prefetch(uint64_t offset, uint64_t length) const;
  std::string url() const;
  // File::expect and File::expectations of the object.
  void expect(Expectation expectation) const;
  std::vector<Expectation> expectations() const;

 private:
  struct Block {
    uint64_t offset = 0;
    std::vector<std::byte> bytes;
    bool holds(uint64_t at, uint64_t length) const {
      return at >= offset && at - offset <= bytes.size() && length <= bytes.size() - (at - offset);
    }
  };
  // BlockCache::read of the object (false: a `cached` read found some bytes missing and copied none).
  bool fetch(uint64_t offset, std::span<std::byte> dst,
             s3::BlockCache::ReadKind kind = s3::BlockCache::ReadKind::stream) const;
  // Checks the expectations guarding any byte of [offset, offset + length), and forgets those that hold.
  void check_expectations(uint64_t offset, uint64_t length) const;
  // The pending expectations guarding any byte of [offset, offset + length) (under expectations_mutex_).
  std::vector<Expectation> guarding(uint64_t offset, uint64_t length) const;
  Block fetch_block(uint64_t offset, uint64_t length) const;
  std::shared_ptr<const RemoteCache> cache_;
  std::string bucket_;
  s3::ObjectInfo info_;
  mutable std::mutex mutex_;  // guards the blocks (held across their fetch: parses read one file in order)
  mutable Block suffix_, block_;
  mutable std::mutex expectations_mutex_;
  mutable std::map<uint64_t, Expectation> expectations_;  // by guard_begin; guards disjoint (records)
  mutable std::atomic<size_t> pending_expectations_{0};   // expectations_.size(): reads skip the lock at 0
};

}  // namespace ckptfs::io
