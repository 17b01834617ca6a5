#include "io/runtime.hpp"

namespace ckptfs::io {

std::shared_ptr<RemoteCache> Runtime::remote_cache(std::shared_ptr<s3::RangeReader> reader) {
  auto cache = std::make_shared<RemoteCache>(std::move(reader), remote_);
  std::lock_guard lock(mutex_);
  remote_caches_.push_back(cache);
  return cache;
}

void Runtime::forked() {
  std::lock_guard lock(mutex_);
  for (const auto& weak : remote_caches_)
    if (const auto cache = weak.lock()) cache->forked();
}

}  // namespace ckptfs::io
