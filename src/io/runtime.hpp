// The caches, pools and limits of one mount or one command (export, cat, index and inspect each make their
// own), handed to what uses them rather than kept in process globals: the block caches of the object-store
// sources it opens (their options, and the fork of the daemon, which their fetch threads do not follow).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "ckptfs/s3_cache.hpp"
#include "io/remote_object.hpp"

namespace ckptfs::io {

class Runtime {
 public:
  explicit Runtime(s3::BlockCacheOptions remote = {}) : remote_(std::move(remote)) {}
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The block cache of an object-store source read through `reader` (-o cache_mb=, cache_dir=,
  // cache_dir_mb=, s3_connections=).
  std::shared_ptr<RemoteCache> remote_cache(std::shared_ptr<s3::RangeReader> reader);
  const s3::BlockCacheOptions& remote_options() const { return remote_; }

  // In the daemon, right after the fork (fuse_daemonize): the caches made before it start afresh.
  void forked();

 private:
  s3::BlockCacheOptions remote_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<RemoteCache>> remote_caches_;
};

}  // namespace ckptfs::io
