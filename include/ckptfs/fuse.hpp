// Serves a VirtualTree through the libfuse3 low-level API: read-only, multithreaded, kernel-cache friendly
// (long entry/attr timeouts, keep_cache, never direct_io). Only this module and src/cli include libfuse.
#pragma once

#include <string>
#include <vector>

#include "ckptfs/vfs.hpp"

namespace ckptfs::fuse {

struct ServeOptions {
  std::string mountpoint;
  // Mount options for libfuse ("allow_other", "fsname=...", ...); "ro" is always added.
  std::vector<std::string> fuse_options;
  bool foreground = false;
  bool debug = false;  // libfuse's request trace on stderr; implies foreground
  unsigned max_threads = 16;
  // Readahead of the mount's bdi (the kernel's default is 128 KiB, which caps FUSE reads at 128 KiB);
  // set when the process may (root), 0 keeps the kernel's default.
  unsigned read_ahead_kb = 1024;
};

// Mounts `tree` and serves it until it is unmounted (fusermount3 -u, umount) or SIGINT/SIGTERM/SIGHUP
// arrives, then unmounts. Without `foreground` the process forks once the mount is live: the parent exits 0
// there (so `ckptfs SRC MNT && ls MNT` works) and the child serves. Throws Error with ExitCode::usage for
// options libfuse rejects and ExitCode::mount_failed when the mount cannot be made.
void serve(const vfs::VirtualTree& tree, const ServeOptions& options);

}  // namespace ckptfs::fuse
