// The kernel's inode numbers over a tree that a live mount replaces (docs/mount.md#live-runs). Each tree
// is a generation; a node keeps its kernel inode from one generation to the next while it stands for the
// same thing (a directory: the same path; a file: the same view path in its tag, size and sources), so the
// kernel keeps its cached pages of what did not change, and a path that now means other bytes gets a new
// inode. A generation lives while the kernel holds an inode of it (lookup counts, FUSE's forget): an open
// file, or a process in a directory of a rotated tag, keeps what it opened.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/vfs.hpp"

namespace ckptfs::fuse {

using KernelIno = uint64_t;

struct Generation {
  std::shared_ptr<const vfs::VirtualTree> tree;
  std::vector<KernelIno> kernel;  // kernel[local ino]: the tree's nodes as the kernel knows them
  std::unique_ptr<std::atomic<uint64_t>[]> served;  // bytes answered per local ino (ckptfs-stats.json)
};

// A node of the tree the kernel named, with the generation that holds it alive.
struct Resolved {
  std::shared_ptr<const Generation> generation;
  const vfs::Node* node = nullptr;  // null: the kernel named an inode it has forgotten, or none
};

// What the kernel must drop from its caches at a replace: names whose inode changed, appeared or went
// (inval_entry) and directories whose listing changed (inval_inode).
struct Invalidations {
  std::vector<std::pair<KernelIno, std::string>> entries;
  std::vector<KernelIno> inodes;
};

class InodeTable {
 public:
  // The first tree's nodes keep their own inode numbers.
  explicit InodeTable(std::shared_ptr<const vfs::VirtualTree> tree);

  Resolved find(KernelIno ino) const;
  std::shared_ptr<const Generation> current() const;
  // `local` of `generation` handed to the kernel in a lookup or readdirplus reply (counted for forget).
  KernelIno looked_up(const std::shared_ptr<const Generation>& generation, vfs::Ino local);
  // FUSE's forget: the kernel dropped `count` references to `ino`.
  void forget(KernelIno ino, uint64_t count);
  // Makes `next` the tree new lookups see. `invalidate` has the kernel drop what changed, twice: before the
  // swap, so that no name it cached from the old tree outlives it (ckptfs.json's new root_tag is seen only
  // once the root's other names are dropped too), and after it, for a lookup answered from the old tree as
  // the swap began. Lookups in between are answered uncacheable.
  void replace(std::shared_ptr<const vfs::VirtualTree> next,
               const std::function<void(const Invalidations&)>& invalidate);
  // Whether the kernel may cache entries of `generation`: the current tree's, no replace under way (not an
  // older directory handle's, nor a lookup that raced the swap: the kernel is to ask for those again).
  bool cacheable(const std::shared_ptr<const Generation>& generation) const;
  // Inode numbers in use, for tests and statfs.
  size_t live_inodes() const;

 private:
  struct Slot {
    std::shared_ptr<const Generation> generation;  // null: free (forgotten, not in the current tree)
    vfs::Ino local = 0;
    std::atomic<uint64_t> lookups{0};
  };
  static std::shared_ptr<Generation> make_generation(std::shared_ptr<const vfs::VirtualTree> tree);

  mutable std::shared_mutex mutex_;
  std::deque<Slot> slots_;  // slots_[kernel ino - 1]; a deque: slots never move, their counters are atomic
  std::shared_ptr<const Generation> current_;
  bool replacing_ = false;  // between a replace's two invalidations
};

}  // namespace ckptfs::fuse
