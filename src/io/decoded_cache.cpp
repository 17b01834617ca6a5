#include "io/decoded_cache.hpp"

namespace ckptfs::io {

DecodedCache::Bytes DecodedCache::find(uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second);
  return it->second->second;
}

void DecodedCache::insert(uint64_t id, Bytes bytes) {
  std::lock_guard lock(mutex_);
  if (index_.contains(id) || bytes->size() > capacity_) return;
  used_ += bytes->size();
  index_[id] = lru_.insert(lru_.end(), {id, std::move(bytes)});
  evict();
}

uint64_t DecodedCache::used() {
  std::lock_guard lock(mutex_);
  return used_;
}

void DecodedCache::evict() {
  while (used_ > capacity_) {
    used_ -= lru_.front().second->size();
    index_.erase(lru_.front().first);
    lru_.pop_front();
  }
}

}  // namespace ckptfs::io
