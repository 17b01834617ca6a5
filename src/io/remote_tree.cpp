#include "io/remote_tree.hpp"

#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "ckptfs/io_tree.hpp"
#include "ckptfs/live_stats.hpp"
#include "io/runtime.hpp"

namespace ckptfs::io {
namespace remote_tree {
namespace {

constexpr std::string_view kScheme = "s3://";

// The non-empty '/'-separated parts after the scheme: the bucket, then the key's parts.
std::vector<std::string> components(std::string_view text) {
  std::vector<std::string> out;
  text.remove_prefix(kScheme.size());
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find('/', at), text.size());
    if (end > at) out.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

std::string joined(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (out.empty() ? "" : "/") + parts[i];
  return out;
}

// One source's listing: its objects and directories by path relative to the source ("" is the source).
struct Tree {
  std::shared_ptr<s3::Client> client;
  std::shared_ptr<const RemoteCache> cache;
  std::vector<std::string> root;  // bucket, then the prefix's parts
  std::map<std::string, s3::ObjectInfo> files;
  std::map<std::string, std::map<std::string, bool>> dirs;

  // Throws SourceError when the listing names `relative` twice with different sizes or ETags (a store that
  // does is not to be trusted with byte ranges; radosgw's POSIX driver has been seen to, docs/s3.md).
  void add(const std::string& relative, const s3::ObjectInfo& info) {
    if (const auto it = files.find(relative); it != files.end()) {
      if (it->second.size == info.size && it->second.etag == info.etag) return;
      throw SourceError(
          fmt::format("s3://{}/{}: the store lists this key twice ({} bytes, ETag {}; then {} bytes, "
                      "ETag {})",
                      root[0], info.key, it->second.size, it->second.etag, info.size, info.etag));
    }
    std::string dir;
    for (size_t at = 0;;) {
      const size_t slash = relative.find('/', at);
      auto& entries = dirs[dir];
      if (slash == std::string::npos) {
        entries[relative.substr(at)] = false;
        files[relative] = info;
        return;
      }
      entries[relative.substr(at, slash - at)] = true;
      dir = relative.substr(0, slash);
      at = slash + 1;
    }
  }
};

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<const Tree>> trees;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: Files may outlive static destruction
  return *instance;
}

struct Found {
  std::shared_ptr<const Tree> tree;
  std::string relative;
};

// The registered source holding `path` (the deepest one when sources nest).
Found find(const std::filesystem::path& path) {
  const auto parts = components(path.native());
  std::shared_ptr<const Tree> best;
  {
    std::lock_guard lock(registry().mutex);
    for (const auto& t : registry().trees)
      if (t->root.size() <= parts.size() && std::equal(t->root.begin(), t->root.end(), parts.begin()) &&
          (!best || t->root.size() > best->root.size()))
        best = t;
  }
  if (!best)
    throw SourceError(
        fmt::format("{}: not below an object-store source opened by this process", path.string()));
  return {best, joined(parts, best->root.size())};
}

}  // namespace

bool is_s3_path(const std::filesystem::path& path) {
  return path.native().starts_with(kScheme);
}

Kind kind(const std::filesystem::path& path) {
  const Found f = find(path);
  if (f.tree->dirs.contains(f.relative)) return Kind::directory;
  return f.tree->files.contains(f.relative) ? Kind::file : Kind::none;
}

std::optional<Object> object(const std::filesystem::path& path) {
  const Found f = find(path);
  const auto it = f.tree->files.find(f.relative);
  if (it == f.tree->files.end() || f.tree->dirs.contains(f.relative)) return std::nullopt;
  return Object{f.tree->cache, f.tree->root[0], it->second};
}

std::map<std::string, bool> children(const std::filesystem::path& path) {
  const Found f = find(path);
  const auto it = f.tree->dirs.find(f.relative);
  return it == f.tree->dirs.end() ? std::map<std::string, bool>{} : it->second;
}

}  // namespace remote_tree

namespace {

// The objects under `root` (bucket, then the prefix's parts) as the store lists them now. Throws SourceError
// when there are none.
std::shared_ptr<remote_tree::Tree> list_source(std::vector<std::string> root,
                                               std::shared_ptr<s3::Client> client,
                                               std::shared_ptr<const RemoteCache> cache) {
  auto tree = std::make_shared<remote_tree::Tree>();
  tree->client = std::move(client);
  tree->cache = std::move(cache);
  tree->root = std::move(root);
  const std::string bucket = tree->root[0];
  const std::string prefix = remote_tree::joined(tree->root, 1);
  // The prefix as a directory ("ckpt/"), and as one object when it names one (a plain torch.save file).
  for (const auto& info : tree->client->list(bucket, prefix.empty() ? "" : prefix + "/"))
    if (!info.key.ends_with('/'))  // a zero-byte "dir/" marker object is no file
      tree->add(remote_tree::joined(remote_tree::components("s3://" + info.key), tree->root.size() - 1),
                info);
  if (tree->files.empty() && !prefix.empty())
    for (const auto& info : tree->client->list(bucket, prefix))
      if (info.key == prefix) tree->files[""] = info;
  if (tree->files.empty())
    throw SourceError(
        fmt::format("s3://{}: no objects under this prefix", remote_tree::joined(tree->root, 0)));
  return tree;
}

}  // namespace

std::filesystem::path open_remote_source(const s3::Url& url, std::shared_ptr<s3::Client> client,
                                         Runtime& runtime) {
  auto cache = runtime.remote_cache(s3::client_reader(client));
  auto tree = list_source(remote_tree::components(url.str()), client, cache);
  const std::filesystem::path source = fmt::format("s3://{}", remote_tree::joined(tree->root, 0));
  runtime.add_source(source);  // its decoded items
  runtime.stats()->add_section("fetched from " + source.string(),
                               [cache = tree->cache] { return cache->figures(); });
  std::lock_guard lock(remote_tree::registry().mutex);
  remote_tree::registry().trees.push_back(std::move(tree));
  return source;
}

void relist_remote_source(const std::filesystem::path& source) {
  const remote_tree::Found found = remote_tree::find(source);
  auto tree = list_source(found.tree->root, found.tree->client, found.tree->cache);
  std::lock_guard lock(remote_tree::registry().mutex);
  for (auto& t : remote_tree::registry().trees)
    if (t == found.tree) t = std::move(tree);  // Files opened from the old listing keep what it showed
}

}  // namespace ckptfs::io
