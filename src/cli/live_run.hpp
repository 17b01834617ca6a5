// A live mount follows the save dir of a run that is still training (docs/mount.md#live-runs): when the
// save dir changes (io::ChangeWatch), it opens the checkpoint again keeping the tags already read, builds
// the tree and hands it to the server, which has the kernel drop what changed. A save is served once its
// framework marks it complete (OpenOptions::known); the root follows the tracker; a deleted tag goes.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/fuse.hpp"
#include "ckptfs/index.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/vfs.hpp"
#include "io/change_watch.hpp"

namespace ckptfs::cli {

class LiveRun {
 public:
  struct Options {
    io::SourcePtr source;  // as open_source returned it
    OpenOptions open;
    vfs::TreeOptions tree;
    std::chrono::seconds refresh;  // the poll's interval where no change events come (s3://, NFS)
    // Where a refreshed checkpoint's index goes (index::Opened's); an empty key: no index cache.
    std::filesystem::path index_file;
    std::string index_key;
  };
  LiveRun(Options options, const Checkpoint& first);

  // What ckptfs.json says under "live" now.
  nlohmann::json description() const;
  // fuse::ServeOptions::follow.
  void follow(const fuse::ReplaceTree& replace, const std::function<void(const std::string&)>& log,
              std::stop_token stop);

 private:
  using Snapshot = std::vector<std::pair<std::filesystem::path, std::optional<io::PathState>>>;
  // Opens the checkpoint again; returns it when what is served changes (tags, root, side files, left out).
  std::optional<Checkpoint> refresh(std::vector<std::string>& changes);
  void remember(const Checkpoint& checkpoint);

  Options options_;
  io::ChangeWatch watch_;  // made with the mount (before the server forks): ckptfs.json says how it watches
  Checkpoint current_;
  std::map<std::string, Snapshot, std::less<>> snapshots_;  // per tag: its dir and files as read
  Snapshot side_files_;
  std::vector<std::string> last_changes_;
  uint64_t refreshes_ = 0;
};

}  // namespace ckptfs::cli
