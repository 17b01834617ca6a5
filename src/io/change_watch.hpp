// Tells a live mount when its save dir may have changed (docs/mount.md#live-runs): inotify on the dir and the
// dirs below it, two levels down (tag dirs and their model folders: where trackers, DCP's .metadata and HF
// Trainer's trainer_state.json are written), at most kMaxWatches of them, dirs watched as they appear; or,
// where inotify cannot tell (NFS, Lustre, GPFS, CephFS, SMB, FUSE: writes of other machines send no
// events; more dirs than the watches allowed; an object store), a poll every `interval`.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <stop_token>
#include <string>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::io {

class ChangeWatch {
 public:
  static constexpr size_t kMaxWatches = 8192;
  static constexpr int kDepth = 2;

  // Watches `source`'s root.
  ChangeWatch(const Source& source, std::chrono::milliseconds interval);
  ~ChangeWatch();
  ChangeWatch(const ChangeWatch&) = delete;
  ChangeWatch& operator=(const ChangeWatch&) = delete;

  // Waits until something changed and settled (no event for a moment, as a save writes its files in a
  // burst), or, polling, until `interval` passed: true; false when `stop` is requested first.
  bool wait(std::stop_token stop);
  // Why it polls ("" when it does not): said once in the log.
  const std::string& polling_because() const { return polling_because_; }

 private:
  void watch_tree(const std::filesystem::path& dir, int depth);
  // Reads the events queued; false when none was.
  bool drain();

  std::chrono::milliseconds interval_;
  int fd_ = -1;
  std::map<int, std::pair<std::filesystem::path, int>> watched_;  // watch descriptor -> dir, its depth
  std::string polling_because_;
};

}  // namespace ckptfs::io
