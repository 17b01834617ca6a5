// Serves a VirtualTree through the libfuse3 low-level API: read-only, multithreaded, kernel-cache friendly
// (long entry/attr timeouts, keep_cache, never direct_io). Only this module and src/cli include libfuse.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "ckptfs/vfs.hpp"

namespace ckptfs::io {
class Runtime;  // src/io/runtime.hpp
}  // namespace ckptfs::io

namespace ckptfs::fuse {

// What an operator sets in place of the access the sources give (-o uid=,gid=,umask=; docs/mount.md).
struct AccessOverride {
  std::optional<uid_t> uid;     // owner of every node
  std::optional<gid_t> gid;     // group of every node
  std::optional<mode_t> umask;  // modes 0444 & ~umask for files, 0555 & ~umask for directories
};

// Makes `tree` the one a live mount serves: new lookups see it, the kernel drops the names, listings and
// inodes that changed, open files keep the tree they were opened on.
using ReplaceTree = std::function<void(std::shared_ptr<const vfs::VirtualTree> tree)>;

struct ServeOptions {
  std::string mountpoint;  // absolute, symbolic links resolved (what check_mountpoint returns)
  // Mount options for libfuse ("allow_other", "fsname=...", ...); "ro" and "default_permissions" are always
  // added: the kernel checks each node's owner and mode (vfs::Node::access) for every user.
  std::vector<std::string> fuse_options;
  AccessOverride access;
  bool foreground = false;
  bool debug = false;  // libfuse's request trace on stderr; implies foreground
  unsigned max_threads = 16;
  // Readahead of the mount's bdi (the kernel's default is 128 KiB, which caps FUSE reads at 128 KiB);
  // set when the process may (root), 0 keeps the kernel's default.
  unsigned read_ahead_kb = 1024;
  // How far ahead of a sequential reader of a file the source ranges are prefetched (posix_fadvise
  // WILLNEED, in each shard's order): the kernel reads the shards in parallel while the request waits on
  // its own. 0 turns it off.
  unsigned prefetch_mb = 32;
  // How long an open trusts the last check that a source file is unchanged (one stat per source, at most
  // once per interval, rather than a stat of each of a 1,024-rank view's sources on every open). 0: check
  // on every open.
  unsigned source_check_ms = 1000;
  // Work that need not delay the mount (writing the index cache): run on a thread of its own once the
  // mount is live, in the process that serves; serve returns only after it has finished. Must not throw;
  // what it returns, when not empty, is logged as a warning (stderr, and syslog when daemonised).
  std::function<std::string()> once_live;
  // A live mount (docs/mount.md#live-runs): runs on a thread of its own once the mount is live, until `stop`
  // is requested as the mount goes away, and hands each new tree to `replace`. Must not throw; `log` writes
  // a line to stderr, and to syslog when daemonised.
  std::function<void(const ReplaceTree& replace, const std::function<void(const std::string&)>& log,
                     std::stop_token stop)>
      follow;
};

// A line of /proc/self/mountinfo.
struct MountEntry {
  std::string device;  // "MAJ:MIN": the bdi of a FUSE mount
  std::string type;    // "fuse.ckptfs", "ext4", ...
  std::string source;  // what df shows (a ckptfs mount: its SRC)
};

// The mount on `mountpoint` (absolute and normalised, as mountinfo spells it), the topmost when mounts are
// stacked there; nullopt when nothing is mounted on it.
std::optional<MountEntry> find_mount(const std::string& mountpoint);

// Returns `mountpoint` with symbolic links resolved, as the kernel will mount it and mountinfo will show it.
// Throws Error(ExitCode::mount_failed) naming `mountpoint` when it cannot take the mount: it is missing or
// not a directory, it is a FUSE mount whose server died ("Transport endpoint is not connected": the message
// says to run fusermount3 -u), or it is already a ckptfs mount. Other mounts there (a bind mount, a
// container volume) are fine: ckptfs mounts on top. Asks the kernel, not its attribute cache, so a dead
// mount cannot pass for a directory.
std::string check_mountpoint(const std::string& mountpoint);

// Mounts `tree` and serves it until it is unmounted (fusermount3 -u, umount) or SIGINT/SIGTERM/SIGHUP
// arrives, then unmounts. Without `foreground` the process forks once the mount is live: the parent exits 0
// there (so `ckptfs SRC MNT && ls MNT` works) and the child serves. Throws Error with ExitCode::usage for
// options libfuse rejects and ExitCode::mount_failed when the mount cannot be made. `runtime` holds the
// caches the tree's files read through (told of the fork; its block cache's size sets the window of remote
// files).
void serve(std::shared_ptr<const vfs::VirtualTree> tree, const ServeOptions& options, io::Runtime& runtime);

}  // namespace ckptfs::fuse
