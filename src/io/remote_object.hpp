// The reads of one object of an object store: every byte a remote File serves comes through fetch()
// (a ranged GET pinned to the ETag the listing showed), the one place where a block cache or a pool of
// parallel GETs plugs in. Small reads (the parsing of a torch.save: magic, zip end records, central
// directory, local headers, data.pkl) go through a one-block read-ahead of the File, so that a parse
// costs a few requests instead of one per header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/s3.hpp"

namespace ckptfs::io {

// Reads at most this long go through the read-ahead block; a miss fetches kReadAheadBlock bytes from
// the read on, or, near the end of the object, its last kReadAheadSuffix bytes (the zip end records and
// central directory of a torch.save in one request).
inline constexpr uint64_t kSmallRemoteRead = uint64_t{128} << 10;
inline constexpr uint64_t kReadAheadBlock = uint64_t{64} << 10;
inline constexpr uint64_t kReadAheadSuffix = uint64_t{256} << 10;

class RemoteReader {
 public:
  RemoteReader(std::shared_ptr<s3::Client> client, std::string bucket, s3::ObjectInfo info);

  // Exactly dst.size() bytes at `offset` (within the object). Throws SourceError naming the object: an
  // s3::Error, or "changed since the mount" when the store no longer has the ETag listed.
  void read(uint64_t offset, std::span<std::byte> dst) const;
  // A hint that [offset, offset + length) will be read. Nothing yet: the block cache will act on it.
  void prefetch(uint64_t offset, uint64_t length) const;
  std::string url() const;

 private:
  void fetch(uint64_t offset, std::span<std::byte> dst) const;
  std::shared_ptr<s3::Client> client_;
  std::string bucket_;
  s3::ObjectInfo info_;
  mutable std::mutex mutex_;  // guards the block
  mutable uint64_t block_offset_ = 0;
  mutable std::vector<std::byte> block_;
};

}  // namespace ckptfs::io
