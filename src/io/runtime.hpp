// The caches, pools and limits of one mount or one command (export, cat, index and inspect each make their
// own), handed to what uses them rather than kept in process globals: the block caches of the object-store
// sources it opens (their options, and the fork of the daemon, which their fetch threads do not follow),
// and the descriptor and decoded-item caches the files of its sources read through (io/source_caches.hpp).
// It makes the io::Source handles the command passes down to what reads its sources.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include "ckptfs/io_tree.hpp"
#include "ckptfs/live_stats.hpp"
#include "ckptfs/s3.hpp"
#include "ckptfs/s3_cache.hpp"
#include "io/remote_object.hpp"
#include "io/source_caches.hpp"

namespace ckptfs::io {

struct RuntimeOptions {
  s3::BlockCacheOptions remote;  // -o cache_mb=, cache_dir=, cache_dir_mb=, s3_connections=
  size_t max_open_files = default_max_open_files();  // -o max_open=N
  // Off while the mount prefetches (-o prefetch_mb=0 leaves it on): see DescriptorCache.
  bool kernel_readahead = true;
  uint64_t decoded_cache_bytes = kDefaultDecodedCacheBytes;  // -o decoded_cache_mb=N
};

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The local source at `root` (absolute), whose files read through this Runtime's descriptor and
  // decoded-item caches, whether spelled under `root` or its canonical path (an index may name either).
  std::shared_ptr<Source> open_local(std::filesystem::path root);
  // The object-store source at `url`, listed once through `client` (remote_tree::Listing; throws as it
  // does), its objects read through a block cache of this Runtime's and their decoded items through its
  // decoded-item cache.
  std::shared_ptr<Source> open_remote(const s3::Url& url, std::shared_ptr<s3::Client> client);
  SourceCaches& caches() { return *caches_; }

  // The block cache of an object-store source read through `reader` (-o cache_mb=, cache_dir=,
  // cache_dir_mb=, s3_connections=).
  std::shared_ptr<RemoteCache> remote_cache(std::shared_ptr<s3::RangeReader> reader);
  const s3::BlockCacheOptions& remote_options() const { return remote_; }

  // In the daemon, right after the fork (fuse_daemonize): the caches made before it start afresh.
  void forked();

  // The sections of the mount's ckptfs-stats.json (-o stats).
  const std::shared_ptr<LiveStats>& stats() const { return stats_; }

 private:
  s3::BlockCacheOptions remote_;
  std::shared_ptr<SourceCaches> caches_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<RemoteCache>> remote_caches_;
  std::shared_ptr<LiveStats> stats_ = std::make_shared<LiveStats>();
};

}  // namespace ckptfs::io
