// The on-disk cache of remote bytes (-o cache_dir=DIR): one file per fetched range, named by a hash of the
// object's identity (bucket, key, ETag) and the range, bounded by dir_bytes (least recently used files go
// first), reused by later mounts. Each file starts with a header holding the whole identity, the range and a
// checksum of the bytes: a file of another ETag (or a hash collision) is never read, and a short or corrupt
// one is deleted and refetched. Files are written to a temporary name and renamed, so a reader (or a crash)
// never sees half a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckptfs::s3 {

class DiskCache {
 public:
  struct Segment {
    std::uint64_t begin, end;
    bool stored;
  };

  // Creates `dir` if needed and indexes the files already there (ckptfs::Error with exit 2 when it cannot).
  DiskCache(std::filesystem::path dir, std::uint64_t max_bytes);

  // [begin, end) of the object cut into the parts stored here and those that are not, in order.
  std::vector<Segment> cover(const std::string& identity, std::uint64_t begin, std::uint64_t end) const;
  // The stored bytes at `begin` (inside one stored part); false when the file is gone, short or corrupt (then
  // it is forgotten and deleted).
  bool load(const std::string& identity, std::uint64_t begin, std::span<std::byte> dst);
  // Keeps a copy of the object's bytes at `begin` unless it overlaps a stored part; evicts the least recently
  // used files beyond the bound. Best effort: a failed write leaves no file behind and is not an error.
  void store(const std::string& identity, std::uint64_t begin, std::span<const std::byte> bytes);

  std::uint64_t bytes() const;

 private:
  struct Entry {
    std::uint64_t end;
    std::uint64_t file_bytes;
    std::uint64_t last_use;
  };
  using Entries = std::map<std::uint64_t, Entry>;  // by begin, disjoint

  std::filesystem::path file_of(std::uint64_t hash, std::uint64_t begin, std::uint64_t end) const;
  void index_existing_files();
  bool overlaps(const Entries& entries, std::uint64_t begin, std::uint64_t end) const;
  void forget(std::uint64_t hash, Entries::iterator it);  // with the lock held
  void evict_beyond_bound();                              // with the lock held

  std::filesystem::path dir_;
  std::uint64_t max_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, Entries> objects_;  // by the identity's hash
  std::uint64_t bytes_ = 0;
  std::uint64_t clock_ = 0;  // last_use stamps
  std::uint64_t temp_counter_ = 0;
};

}  // namespace ckptfs::s3
