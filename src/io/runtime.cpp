#include "io/runtime.hpp"

#include "ckptfs/io_tree.hpp"

namespace ckptfs::io {

Runtime::Runtime(RuntimeOptions options)
    : remote_(std::move(options.remote)),
      caches_(std::make_shared<SourceCaches>(options.max_open_files, options.kernel_readahead,
                                             options.decoded_cache_bytes)) {}

void Runtime::add_source(const std::filesystem::path& root) {
  register_source(root, caches_);
  std::error_code ec;
  if (const auto canonical = io::canonical(root, ec); !ec && canonical != root)
    register_source(canonical, caches_);
}

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
