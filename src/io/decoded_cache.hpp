// Whole decoded items (io::DecodedItem), least recently used first out, bounded by their total size: one
// per io::Runtime, shared by the decoded items of its sources (io/source_caches.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ckptfs::io {

// Most decoded bytes a cache holds by default (-o decoded_cache_mb=N).
inline constexpr uint64_t kDefaultDecodedCacheBytes = uint64_t{256} << 20;

class DecodedCache {
 public:
  using Bytes = std::shared_ptr<const std::vector<std::byte>>;

  explicit DecodedCache(uint64_t capacity) : capacity_(capacity) {}
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  // The bytes of item `id` (DecodedItem's own key), or null.
  Bytes find(uint64_t id);
  // Keeps `bytes` as item `id`'s unless they are larger than the whole cache.
  void insert(uint64_t id, Bytes bytes);
  uint64_t capacity() const { return capacity_; }
  // Decoded bytes held now (for tests).
  uint64_t used();

 private:
  void evict();  // under mutex_

  std::mutex mutex_;
  const uint64_t capacity_;
  uint64_t used_ = 0;
  std::list<std::pair<uint64_t, Bytes>> lru_;
  std::unordered_map<uint64_t, std::list<std::pair<uint64_t, Bytes>>::iterator> index_;
};

}  // namespace ckptfs::io
