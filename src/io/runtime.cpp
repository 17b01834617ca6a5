#include "io/runtime.hpp"

#include "io/remote_tree.hpp"

namespace ckptfs::io {

Runtime::Runtime(RuntimeOptions options)
    : remote_(std::move(options.remote)),
      caches_(std::make_shared<SourceCaches>(options.max_open_files, options.kernel_readahead,
                                             options.decoded_cache_bytes)) {}

std::shared_ptr<Source> Runtime::open_local(std::filesystem::path root) {
  return std::make_shared<Source>(std::move(root), caches_);
}

std::shared_ptr<Source> Runtime::open_remote(const s3::Url& url, std::shared_ptr<s3::Client> client) {
  auto cache = remote_cache(s3::client_reader(client));
  auto listing = std::make_shared<remote_tree::Listing>(url, std::move(client), cache);
  stats_->add_section("fetched from " + listing->root().string(), [cache] { return cache->figures(); });
  auto root = listing->root();
  return std::make_shared<Source>(std::move(root), caches_, std::move(listing));
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
