#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ckptfs/vfs.hpp"

namespace ckptfs::vfs {

namespace {

// Splits "a/b/c" into its components, rejecting what could not be a name in a directory.
std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> out;
  size_t begin = 0;
  while (true) {
    const size_t end = path.find('/', begin);
    const std::string_view part = path.substr(begin, end == std::string_view::npos ? end : end - begin);
    if (part.empty() || part == "." || part == "..")
      throw std::invalid_argument(fmt::format("invalid path in the virtual tree: '{}'", path));
    out.push_back(part);
    if (end == std::string_view::npos) return out;
    begin = end + 1;
  }
}

auto child_position(const Node& dir, std::string_view name) {
  return std::lower_bound(dir.children.begin(), dir.children.end(), name,
                          [](const auto& child, std::string_view n) { return child.first < n; });
}

}  // namespace

const Node* VirtualTree::node(Ino ino) const {
  if (ino < kRootIno || ino > nodes_.size()) return nullptr;
  return &nodes_[ino - 1];
}

const Node* VirtualTree::lookup(Ino parent, std::string_view name) const {
  const Node* dir = node(parent);
  if (dir == nullptr || !dir->is_dir) return nullptr;
  auto it = child_position(*dir, name);
  return it != dir->children.end() && it->first == name ? node(it->second) : nullptr;
}

std::string VirtualTree::path(Ino ino) const {
  std::string out;
  for (const Node* n = node(ino); n != nullptr && n->ino != kRootIno; n = node(n->parent))
    out = out.empty() ? n->name : n->name + "/" + out;
  return out;
}

TreeBuilder::TreeBuilder(io::Access root_access) {
  Node root;
  root.ino = kRootIno;
  root.parent = kRootIno;
  root.is_dir = true;
  root.access = root_access;
  tree_.nodes_.push_back(std::move(root));
  access_set_.push_back(true);
}

void TreeBuilder::reserve(size_t entries) {
  tree_.nodes_.reserve(entries);
  index_.reserve(entries);
}

Ino TreeBuilder::find(Ino parent, std::string_view name) const {
  auto it = index_.find(ChildKeyView{parent, name});
  return it != index_.end() ? it->second : 0;
}

Ino TreeBuilder::add_child(Ino parent, std::string_view name, bool is_dir) {
  Node child;
  child.ino = tree_.nodes_.size() + 1;
  child.parent = parent;
  child.name = name;
  child.is_dir = is_dir;
  Node& dir = tree_.nodes_[parent - 1];
  dir.children.emplace_back(child.name, child.ino);  // sorted once, in build()
  dir.subdirs += is_dir ? 1 : 0;
  index_.emplace(ChildKey{parent, child.name}, child.ino);
  tree_.nodes_.push_back(std::move(child));  // invalidates `dir`
  access_set_.push_back(false);
  return tree_.nodes_.back().ino;
}

Ino TreeBuilder::add_parents(std::string_view path, const std::vector<std::string_view>& parts) {
  const size_t slash = path.rfind('/');
  const std::string_view dir_path =
      slash == std::string_view::npos ? std::string_view() : path.substr(0, slash);
  Ino dir = kRootIno;
  if (dir_path == last_dir_path_) {  // views add their files directory by directory
    dir = last_dir_;
  } else {
    dir = add_directories(path, parts);
    last_dir_path_ = dir_path;
    last_dir_ = dir;
  }
  if (find(dir, parts.back()) != 0)
    throw std::invalid_argument(fmt::format("virtual tree: '{}' added twice", path));
  return dir;
}

Ino TreeBuilder::add_directories(std::string_view path, const std::vector<std::string_view>& parts) {
  Ino dir = kRootIno;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    Ino next = find(dir, parts[i]);
    if (next == 0) {
      next = add_child(dir, parts[i], true);
    } else if (!tree_.nodes_[next - 1].is_dir) {
      throw std::invalid_argument(
          fmt::format("virtual tree: '{}' is a file, cannot hold '{}'", parts[i], path));
    }
    dir = next;
  }
  return dir;
}

Ino TreeBuilder::add_file(std::string_view path, views::VirtualFilePtr file,
                          std::optional<io::Access> access) {
  const auto parts = components(path);
  const Ino ino = add_child(add_parents(path, parts), parts.back(), false);
  Node& node = tree_.nodes_[ino - 1];
  if (access) {
    node.access = *access;
    access_set_[ino - 1] = true;
  }
  tree_.total_bytes_ += file->size();
  node.sources = file->sources();
  node.file = std::move(file);
  for (const auto& s : node.sources) node.mtime_ns = std::max(node.mtime_ns, s->mtime_ns());
  return ino;
}

void TreeBuilder::set_directory_access(std::string_view path, io::Access access) {
  Ino dir = kRootIno;
  if (!path.empty()) {
    auto parts = components(path);
    parts.emplace_back();  // add_directories makes every component but the last
    dir = add_directories(path, parts);
  }
  tree_.nodes_[dir - 1].access = access;
  access_set_[dir - 1] = true;
}

void TreeBuilder::add_link(std::string_view path, Ino target) {
  if (target <= kRootIno || target > tree_.nodes_.size() || tree_.nodes_[target - 1].is_dir)
    throw std::invalid_argument(fmt::format("virtual tree: '{}' links to no regular file", path));
  const auto parts = components(path);
  const Ino dir = add_parents(path, parts);
  Node& parent = tree_.nodes_[dir - 1];
  parent.children.emplace_back(std::string(parts.back()), target);
  index_.emplace(ChildKey{dir, std::string(parts.back())}, target);
  tree_.nodes_[target - 1].links += 1;
}

VirtualTree TreeBuilder::build() && {
  for (auto& n : tree_.nodes_) std::sort(n.children.begin(), n.children.end());
  int64_t newest = 0;
  for (const auto& n : tree_.nodes_) newest = std::max(newest, n.mtime_ns);
  for (auto& n : tree_.nodes_)
    if (n.mtime_ns == 0) n.mtime_ns = newest;
  // A parent's ino is below its children's: one pass in ino order hands access down.
  for (auto& n : tree_.nodes_) {
    if (access_set_[n.ino - 1]) continue;
    n.access = tree_.nodes_[n.parent - 1].access;
    if (!n.is_dir) n.access.mode &= 0444;
  }
  return std::move(tree_);
}

}  // namespace ckptfs::vfs
