// The mounted tree: an immutable inode table of directories and regular files (virtual files), built once
// before mounting. Lookups are O(log n), nothing here touches tensor bytes, and inode numbers depend only
// on the order files are added, so the same checkpoint always gets the same numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/layout.hpp"
#include "ckptfs/live_stats.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs::vfs {

using Ino = uint64_t;
inline constexpr Ino kRootIno = 1;  // FUSE_ROOT_ID

struct Node {
  Ino ino = 0;
  Ino parent = 0;
  std::string name;
  bool is_dir = false;
  int64_t mtime_ns = 0;
  // Who may read it (docs/mount.md#permissions): a file, r bits only; a directory, x wherever r.
  io::Access access;
  // Regular files: the bytes, and file->sources() (the files they are read from), kept here because
  // every open checks them.
  views::VirtualFilePtr file;
  std::vector<io::FilePtr> sources;
  // Directories: (name, ino) sorted by name; subdirs counts the directories among them (for st_nlink).
  std::vector<std::pair<std::string, Ino>> children;
  uint32_t subdirs = 0;
  uint32_t links = 1;  // regular files: directory entries naming this node (a root view and tags/<latest>/)

  uint64_t size() const { return file ? file->size() : 0; }
};

class VirtualTree {
 public:
  const Node* node(Ino ino) const;
  const Node* lookup(Ino parent, std::string_view name) const;
  // "a/b/c" relative to the root ("" for the root), for log messages.
  std::string path(Ino ino) const;
  size_t node_count() const { return nodes_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  friend class TreeBuilder;
  std::vector<Node> nodes_;  // nodes_[ino - 1]
  uint64_t total_bytes_ = 0;
};

class TreeBuilder {
 public:
  explicit TreeBuilder(io::Access root = {0, 0, 0555});
  // Adds a regular file at `path` ("fp32/model.safetensors"), creating its directories. Throws
  // std::invalid_argument when the path is empty, has an empty, "." or ".." component, or is taken.
  // Without `access` the file gets its directory's read bits, owner and group.
  Ino add_file(std::string_view path, views::VirtualFilePtr file,
               std::optional<io::Access> access = std::nullopt);
  // The access of directory `path` ("" the root) and of the directories below it that have none of their own
  // (they take their parent's); the directory is created when missing.
  void set_directory_access(std::string_view path, io::Access access);
  // Adds `path` as a second name of the regular file `target` (a hard link: one inode, one page-cache
  // copy). Throws std::invalid_argument as add_file does.
  void add_link(std::string_view path, Ino target);
  // Room for about `entries` nodes and names, so that building a large tree does not rehash.
  void reserve(size_t entries);
  // Directories and files without sources get the newest mtime of all sources; directories without an
  // access of their own their parent's, files without one their directory's read bits.
  VirtualTree build() &&;

 private:
  Ino add_child(Ino parent, std::string_view name, bool is_dir);
  // Creates the directories of `path` (its components `parts`) and returns the last one's ino; throws
  // when one of them is a file or the final name is taken.
  Ino add_parents(std::string_view path, const std::vector<std::string_view>& parts);
  // The directories of `path`, created where missing; add_parents without the cache or the final check.
  Ino add_directories(std::string_view path, const std::vector<std::string_view>& parts);
  Ino find(Ino parent, std::string_view name) const;

  // (parent, name) -> ino while building: children are appended and sorted once in build(), so a
  // directory of n entries costs O(n log n), not O(n^2).
  struct ChildKey {
    Ino parent;
    std::string name;
  };
  struct ChildKeyView {  // what lookups pass: no string is built per path component
    Ino parent;
    std::string_view name;
  };
  struct ChildKeyHash {
    using is_transparent = void;
    size_t operator()(const ChildKeyView& k) const {
      return std::hash<std::string_view>()(k.name) * 31 + k.parent;
    }
    size_t operator()(const ChildKey& k) const { return (*this)(ChildKeyView{k.parent, k.name}); }
  };
  struct ChildKeyEqual {
    using is_transparent = void;
    static ChildKeyView view(const ChildKey& k) { return {k.parent, k.name}; }
    static ChildKeyView view(const ChildKeyView& k) { return k; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return view(a).parent == view(b).parent && view(a).name == view(b).name;
    }
  };
  VirtualTree tree_;
  std::unordered_map<ChildKey, Ino, ChildKeyHash, ChildKeyEqual> index_;
  std::vector<bool> access_set_;  // per ino - 1: given by add_file or set_directory_access
  // The directory the last file went into ("" and the root at first): consecutive files of a view share
  // it, and directories are never removed, so its ino stays right.
  std::string last_dir_path_;
  Ino last_dir_ = kRootIno;
};

// A path of the tree as a user writes it ("fp32/model.safetensors", "/hf/config.json", "./a//b/"): the
// node it names, or, when none, the deepest directory on the way that exists and the first name not in it
// (for a "no such file" message that lists what is there).
struct PathLookup {
  const Node* node = nullptr;     // the file or directory named; null when there is none
  const Node* deepest = nullptr;  // without `node`: the last directory found (at least the root)
  std::string missing;            // without `node`: the component not found in `deepest`
};
PathLookup lookup_path(const VirtualTree& tree, std::string_view path);

// The names in directory `dir` closest to `name` (fewest edits, then directory order; an empty `name`:
// directory order), at most `limit`, directories with a trailing "/".
std::vector<std::string> closest_names(const VirtualTree& tree, const Node& dir, std::string_view name,
                                       size_t limit);

struct TreeOptions {
  // -o stats: ckptfs-stats.json, the figures of these (the mount's Runtime's) at each open; none without.
  std::shared_ptr<const io::LiveStats> stats;
  ShardOptions shards;  // -o shard_size
  // A live mount (docs/mount.md#live-runs): what ckptfs.json says of it under "live" (null: a snapshot).
  nlohmann::json live;
  GgufOptions gguf;  // -o gguf_pre
};

// The mount layout for `checkpoint` (docs/mount.md): the latest tag's views at the root, the side files,
// tags/<tag>/ for every tag, ckptfs.json, and source/<name> for side files whose name a view takes. The files
// it passes through are opened from `source`, the checkpoint's.
VirtualTree build_tree(const io::Source& source, const Checkpoint& checkpoint,
                       const TreeOptions& options = {});

}  // namespace ckptfs::vfs
