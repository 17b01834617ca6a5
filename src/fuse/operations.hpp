// The low-level FUSE callbacks over a VirtualTree (private to src/fuse).
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "ckptfs/fuse.hpp"
#include "ckptfs/vfs.hpp"
#include "fuse/inode_table.hpp"
#include "fuse/read_ahead.hpp"

namespace ckptfs::fuse {

// What the callbacks reach through fuse_req_userdata(); outlives the session.
struct Context {
  InodeTable* inodes = nullptr;  // the tree served, as the kernel's inode numbers name its nodes
  AccessOverride access;  // -o uid=,gid=,umask=, in place of the nodes' own
  bool live = false;       // the tree may be replaced (ServeOptions::follow)
  bool use_syslog = false;  // daemonised: stderr is /dev/null
  uint64_t prefetch_bytes = 0;  // how far ahead of a sequential reader source ranges are prefetched
  uint64_t remote_cache_bytes = 0;  // ServeOptions::remote_cache_bytes
  OpenFiles* open_files = nullptr;  // the prefetch state of every open file
  std::chrono::milliseconds source_check_interval{0};  // ServeOptions::source_check_ms
};

fuse_lowlevel_ops make_operations();

// One line to stderr, and to syslog when daemonised.
void log_error(const Context& context, const std::string& message);

}  // namespace ckptfs::fuse
