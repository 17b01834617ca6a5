#include "fuse/inode_table.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <unordered_map>

namespace ckptfs::fuse {

namespace {

// A file without sources larger than this (none is, today) gets a new inode at every replace rather than
// being read to compare.
constexpr uint64_t kComparedInlineBytes = uint64_t{64} << 10;

// What a node stands for, hashed: a directory its path; a file its path inside its tag (the root's views
// and tags/<latest>/ are one node), its size and its sources' identities, or its bytes when it has none.
struct NodeKey {
  size_t a = 0, b = 0;
  bool operator==(const NodeKey&) const = default;
};
struct NodeKeyHash {
  size_t operator()(const NodeKey& k) const { return k.a ^ (k.b * 31); }
};

std::string view_path(std::string path) {
  const std::string tags = std::string(views::kTagsDir) + "/";
  if (!path.starts_with(tags)) return path;
  const size_t tag_end = path.find('/', tags.size());
  return tag_end == std::string::npos ? path : path.substr(tag_end + 1);
}

std::optional<NodeKey> key_of(const vfs::VirtualTree& tree, const vfs::Node& node) {
  std::string material;
  if (node.is_dir) {
    material = "dir:" + tree.path(node.ino);
  } else {
    material = fmt::format("file:{}:{}", view_path(tree.path(node.ino)), node.size());
    if (node.file->live()) {
      material += ":live";
    } else if (!node.sources.empty()) {
      for (const auto& s : node.sources) {
        const io::FileIdentity& id = s->identity();
        material += fmt::format(":{}:{}:{}:{}:{}:{}:{}:{}", s->path().string(), id.device, id.inode, id.size,
                                id.mtime_ns, id.ctime_ns, id.etag, id.last_modified);
      }
    } else if (node.size() <= kComparedInlineBytes) {
      std::string bytes(node.size(), '\0');
      node.file->read(0, std::as_writable_bytes(std::span(bytes)));
      material += ":" + bytes;
    } else {
      return std::nullopt;
    }
  }
  const std::hash<std::string> hash;
  return NodeKey{hash(material), hash(material + '\1')};
}

// Directories of both trees whose entries differ: the names that changed, and the listing.
Invalidations invalidations(const Generation& old, const std::unordered_map<KernelIno, vfs::Ino>& old_dirs,
                            const Generation& g) {
  Invalidations out;
  for (vfs::Ino ino = 1; ino <= g.tree->node_count(); ++ino) {
    const vfs::Node& dir = *g.tree->node(ino);
    const auto before = old_dirs.find(g.kernel[ino]);
    if (!dir.is_dir || before == old_dirs.end()) continue;
    std::map<std::string_view, std::pair<KernelIno, KernelIno>> names;  // name -> (old, new)
    for (const auto& [name, child] : old.tree->node(before->second)->children)
      names[name].first = old.kernel[child];
    for (const auto& [name, child] : dir.children) names[name].second = g.kernel[child];
    bool changed = false;
    for (const auto& [name, inos] : names) {
      if (inos.first == inos.second) continue;
      out.entries.emplace_back(g.kernel[ino], std::string(name));
      changed = true;
    }
    if (changed) out.inodes.push_back(g.kernel[ino]);
  }
  return out;
}

}  // namespace

std::shared_ptr<Generation> InodeTable::make_generation(std::shared_ptr<const vfs::VirtualTree> tree) {
  auto g = std::make_shared<Generation>();
  g->kernel.assign(tree->node_count() + 1, 0);
  g->served = std::make_unique<std::atomic<uint64_t>[]>(tree->node_count() + 1);
  g->tree = std::move(tree);
  return g;
}

InodeTable::InodeTable(std::shared_ptr<const vfs::VirtualTree> tree) {
  auto g = make_generation(std::move(tree));
  for (vfs::Ino ino = 1; ino <= g->tree->node_count(); ++ino) {
    g->kernel[ino] = ino;
    Slot& slot = slots_.emplace_back();
    slot.generation = g;
    slot.local = ino;
  }
  current_ = std::move(g);
}

Resolved InodeTable::find(KernelIno ino) const {
  std::shared_lock lock(mutex_);
  if (ino == vfs::kRootIno) return {current_, current_->tree->node(vfs::kRootIno)};
  if (ino == 0 || ino > slots_.size()) return {};
  const Slot& slot = slots_[ino - 1];
  if (!slot.generation) return {};
  return {slot.generation, slot.generation->tree->node(slot.local)};
}

std::shared_ptr<const Generation> InodeTable::current() const {
  std::shared_lock lock(mutex_);
  return current_;
}

KernelIno InodeTable::looked_up(const std::shared_ptr<const Generation>& generation, vfs::Ino local) {
  const KernelIno ino = generation->kernel[local];
  {
    std::shared_lock lock(mutex_);
    Slot& slot = slots_[ino - 1];
    if (slot.generation) {
      slot.lookups.fetch_add(1, std::memory_order_relaxed);
      return ino;
    }
  }
  // Forgotten, and named again through a directory of an older generation someone still holds.
  std::unique_lock lock(mutex_);
  Slot& slot = slots_[ino - 1];
  if (!slot.generation) {
    slot.generation = generation;
    slot.local = local;
  }
  slot.lookups.fetch_add(1, std::memory_order_relaxed);
  return ino;
}

void InodeTable::forget(KernelIno ino, uint64_t count) {
  if (ino <= vfs::kRootIno) return;
  std::unique_lock lock(mutex_);
  if (ino > slots_.size()) return;
  Slot& slot = slots_[ino - 1];
  const uint64_t before = slot.lookups.load(std::memory_order_relaxed);
  slot.lookups.store(before > count ? before - count : 0, std::memory_order_relaxed);
  if (before <= count && slot.generation != current_) slot.generation.reset();
}

size_t InodeTable::live_inodes() const {
  std::shared_lock lock(mutex_);
  size_t n = 0;
  for (const Slot& s : slots_) n += s.generation ? 1 : 0;
  return n;
}

void InodeTable::replace(std::shared_ptr<const vfs::VirtualTree> next,
                         const std::function<void(const Invalidations&)>& invalidate) {
  const std::shared_ptr<const Generation> old = current();
  std::unordered_map<NodeKey, KernelIno, NodeKeyHash> old_inos;
  for (vfs::Ino ino = 1; ino <= old->tree->node_count(); ++ino)
    if (const auto key = key_of(*old->tree, *old->tree->node(ino))) old_inos.emplace(*key, old->kernel[ino]);

  auto g = make_generation(std::move(next));
  std::unordered_map<KernelIno, bool> taken;  // kernel inos given to a node of `g`
  std::vector<vfs::Ino> fresh;                // nodes of `g` that need a new inode
  for (vfs::Ino ino = 1; ino <= g->tree->node_count(); ++ino) {
    KernelIno kernel = ino == vfs::kRootIno ? vfs::kRootIno : 0;
    if (kernel == 0)
      if (const auto key = key_of(*g->tree, *g->tree->node(ino)))
        if (auto it = old_inos.find(*key); it != old_inos.end() && !taken.contains(it->second))
          kernel = it->second;
    if (kernel == 0) {
      fresh.push_back(ino);
    } else {
      g->kernel[ino] = kernel;
      taken[kernel] = true;
    }
  }

  std::unordered_map<KernelIno, vfs::Ino> old_dirs;  // kernel ino -> local ino of old's directories
  for (vfs::Ino ino = 1; ino <= old->tree->node_count(); ++ino)
    if (old->tree->node(ino)->is_dir) old_dirs.emplace(old->kernel[ino], ino);
  {
    std::unique_lock lock(mutex_);
    for (vfs::Ino ino : fresh) {  // free until the swap: the kernel knows none of them yet
      slots_.emplace_back();
      g->kernel[ino] = slots_.size();
    }
    replacing_ = true;
  }
  const Invalidations changed = invalidations(*old, old_dirs, *g);
  invalidate(changed);
  {
    std::unique_lock lock(mutex_);
    for (vfs::Ino ino = 1; ino <= g->tree->node_count(); ++ino) {
      Slot& slot = slots_[g->kernel[ino] - 1];
      slot.generation = g;
      slot.local = ino;
    }
    // What only the old tree had stays while the kernel holds it.
    for (vfs::Ino ino = 1; ino <= old->tree->node_count(); ++ino) {
      Slot& slot = slots_[old->kernel[ino] - 1];
      if (slot.generation == old && slot.lookups.load(std::memory_order_relaxed) == 0)
        slot.generation.reset();
    }
    current_ = g;
    replacing_ = false;
  }
  invalidate(changed);
}

bool InodeTable::cacheable(const std::shared_ptr<const Generation>& generation) const {
  std::shared_lock lock(mutex_);
  return generation == current_ && !replacing_;
}

}  // namespace ckptfs::fuse
