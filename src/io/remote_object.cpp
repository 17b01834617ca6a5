#include "io/remote_object.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "io/expectation.hpp"

namespace ckptfs::io {

RemoteCache::~RemoteCache() {
  delete cache_;
}

s3::BlockCache& RemoteCache::get() const {
  std::lock_guard lock(mutex_);
  if (cache_ == nullptr) cache_ = new s3::BlockCache(reader_, options_);
  return *cache_;
}

void RemoteCache::forked() {
  std::lock_guard lock(mutex_);
  cache_ = nullptr;
}

nlohmann::json RemoteCache::figures() const {
  s3::BlockCache* cache = nullptr;
  {
    std::lock_guard lock(mutex_);
    cache = cache_;
  }
  if (cache == nullptr) {  // nothing read yet: every counter 0
    nlohmann::json out = s3::BlockCacheStats{};
    out["objects"] = nlohmann::json::array();
    return out;
  }
  nlohmann::json out = cache->stats();
  out["objects"] = cache->object_stats();
  return out;
}

RemoteReader::RemoteReader(std::shared_ptr<const RemoteCache> cache, std::string bucket, s3::ObjectInfo info)
    : cache_(std::move(cache)), bucket_(std::move(bucket)), info_(std::move(info)) {}

std::string RemoteReader::url() const {
  return fmt::format("s3://{}/{}", bucket_, info_.key);
}

bool RemoteReader::fetch(uint64_t offset, std::span<std::byte> dst, s3::BlockCache::ReadKind kind) const {
  try {
    return cache_->get().read(s3::object_id(bucket_, info_), offset, dst, kind);
  } catch (const s3::ObjectChangedError&) {
    throw SourceError(
        fmt::format("{}: changed since the mount (the store no longer has ETag {}); remount to "
                    "serve the new checkpoint",
                    url(), info_.etag));
  }
}

RemoteReader::Block RemoteReader::fetch_block(uint64_t offset, uint64_t length) const {
  Block block{offset, std::vector<std::byte>(length)};
  fetch(offset, block.bytes);
  return block;
}

void RemoteReader::read(uint64_t offset, std::span<std::byte> dst) const {
  if (pending_expectations_.load(std::memory_order_acquire) != 0) check_expectations(offset, dst.size());
  if (dst.size() > kSmallRemoteRead) return (void)fetch(offset, dst);
  // A view's slice of a rank object, prefetched: copied from the cache, not through a block of its own.
  if (fetch(offset, dst, s3::BlockCache::ReadKind::cached)) return;
  const uint64_t size = info_.size;
  const uint64_t suffix_start = size - std::min(size, kReadAheadSuffix);
  std::lock_guard lock(mutex_);
  const Block* from = nullptr;
  if (offset >= suffix_start) {
    if (suffix_.bytes.empty()) suffix_ = fetch_block(suffix_start, size - suffix_start);
    from = &suffix_;
  } else {
    if (!block_.holds(offset, dst.size()))
      block_ = fetch_block(offset,
                           std::min(size, offset + std::max<uint64_t>(dst.size(), kReadAheadBlock)) - offset);
    from = &block_;
  }
  std::memcpy(dst.data(), from->bytes.data() + (offset - from->offset), dst.size());
}

void RemoteReader::prefetch(uint64_t offset, uint64_t length) const {
  if (offset >= info_.size) return;
  length = std::min(length, info_.size - offset);
  s3::BlockCache& cache = cache_->get();
  const s3::ObjectId id = s3::object_id(bucket_, info_);
  if (pending_expectations_.load(std::memory_order_acquire) != 0) {
    // The pieces the first read will check: in the same GET when they lie just before the range, else in
    // one of their own started now (the read would wait for it).
    const std::lock_guard lock(expectations_mutex_);
    uint64_t from = offset;
    for (const Expectation& e : guarding(offset, length)) {
      if (e.pieces.empty()) continue;
      const auto [lo, hi] = pieces_span(e);
      if (lo >= offset) continue;
      if (offset - lo <= kRemoteReadGap)
        from = std::min(from, lo);
      else
        cache.prefetch(id, lo, hi - lo);
    }
    length += offset - from, offset = from;
  }
  cache.prefetch(id, offset, length);
}

void RemoteReader::expect(Expectation expectation) const {
  if (expectation.guard_begin >= expectation.guard_end) return;  // guards no byte
  const std::lock_guard lock(expectations_mutex_);
  if (!guarding(expectation.guard_begin, expectation.guard_end - expectation.guard_begin).empty())
    throw std::invalid_argument(fmt::format("{}: expectations guarding [{}, {}) overlap", url(),
                                            expectation.guard_begin, expectation.guard_end));
  const uint64_t key = expectation.guard_begin;
  expectations_.emplace(key, std::move(expectation));
  pending_expectations_.store(expectations_.size(), std::memory_order_release);
}

std::vector<Expectation> RemoteReader::expectations() const {
  const std::lock_guard lock(expectations_mutex_);
  std::vector<Expectation> out;
  for (const auto& [begin, e] : expectations_) out.push_back(e);
  return out;
}

std::vector<Expectation> RemoteReader::guarding(uint64_t offset, uint64_t length) const {
  std::vector<Expectation> out;
  auto it = expectations_.upper_bound(offset);
  if (it != expectations_.begin() && std::prev(it)->second.guard_end > offset) --it;
  for (; it != expectations_.end() && it->first < offset + length; ++it) out.push_back(it->second);
  return out;
}

void RemoteReader::check_expectations(uint64_t offset, uint64_t length) const {
  std::vector<Expectation> due;
  {
    const std::lock_guard lock(expectations_mutex_);
    due = guarding(offset, length);
  }
  // Outside the lock (each piece may be a GET); two readers may check one expectation at once, harmlessly.
  for (const Expectation& e : due) {
    check_expectation(e, url(), [this](uint64_t at, std::span<std::byte> dst) {
      fetch(at, dst, s3::BlockCache::ReadKind::probe);
    });
    const std::lock_guard lock(expectations_mutex_);
    expectations_.erase(e.guard_begin);
    pending_expectations_.store(expectations_.size(), std::memory_order_release);
  }
}

}  // namespace ckptfs::io
