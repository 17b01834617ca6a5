// The low-level FUSE callbacks over a VirtualTree (private to src/fuse).
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/fuse.hpp"
#include "ckptfs/vfs.hpp"
#include "fuse/inode_table.hpp"
#include "fuse/read_ahead.hpp"

namespace ckptfs::fuse {

// What the callbacks reach through fuse_req_userdata(); outlives the session.
// The (file, failing source) pairs a mount has logged: a changed or unreadable shard is reported once per
// file, not once per read of the thousands a loader makes.
class FailureLog {
 public:
  // True the first time `ino` fails for `source`.
  bool first(fuse_ino_t ino, std::string_view source) {
    std::lock_guard lock(mutex_);
    return logged_.emplace(ino, std::string(source)).second;
  }

 private:
  std::mutex mutex_;
  std::set<std::pair<fuse_ino_t, std::string>, std::less<>> logged_;
};

struct Context {
  InodeTable* inodes = nullptr;     // the tree served, as the kernel's inode numbers name its nodes
  AccessOverride access;            // -o uid=,gid=,umask=, in place of the nodes' own
  bool live = false;                // the tree may be replaced (ServeOptions::follow)
  bool use_syslog = false;          // daemonised: stderr is /dev/null
  uint64_t prefetch_bytes = 0;      // how far ahead of a sequential reader source ranges are prefetched
  uint64_t remote_cache_bytes = 0;  // the block cache's memory (io::Runtime::remote_options)
  OpenFiles* open_files = nullptr;  // the prefetch state of every open file
  std::chrono::milliseconds source_check_interval{0};  // ServeOptions::source_check_ms
  FailureLog* failures = nullptr;
};

fuse_lowlevel_ops make_operations();

// One line to stderr, and to syslog when daemonised.
void log_error(const Context& context, const std::string& message);

}  // namespace ckptfs::fuse
