#include "io/remote_tree.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ckptfs/error.hpp"

namespace ckptfs::io::remote_tree {
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

}  // namespace

// One source's listing: its objects and directories by path relative to the source ("" is the source).
struct Tree {
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

namespace {

// The objects under `root` (bucket, then the prefix's parts) as the store lists them now. Throws SourceError
// when there are none.
std::shared_ptr<const Tree> list_source(const std::vector<std::string>& root, s3::Client& client) {
  auto tree = std::make_shared<Tree>();
  tree->root = root;
  const std::string bucket = root[0];
  const std::string prefix = joined(root, 1);
  // The prefix as a directory ("ckpt/"), and as one object when it names one (a plain torch.save file).
  for (const auto& info : client.list(bucket, prefix.empty() ? "" : prefix + "/"))
    if (!info.key.ends_with('/'))  // a zero-byte "dir/" marker object is no file
      tree->add(joined(components("s3://" + info.key), root.size() - 1), info);
  if (tree->files.empty() && !prefix.empty())
    for (const auto& info : client.list(bucket, prefix))
      if (info.key == prefix) tree->files[""] = info;
  if (tree->files.empty())
    throw SourceError(fmt::format("s3://{}: no objects under this prefix", joined(root, 0)));
  return tree;
}

}  // namespace

bool is_s3_path(const std::filesystem::path& path) {
  return path.native().starts_with(kScheme);
}

Listing::Listing(const s3::Url& url, std::shared_ptr<s3::Client> client,
                 std::shared_ptr<const RemoteCache> cache)
    : client_(std::move(client)),
      cache_(std::move(cache)),
      parts_(components(url.str())),
      root_(fmt::format("s3://{}", joined(parts_, 0))),
      tree_(list_source(parts_, *client_)) {}

Listing::~Listing() = default;

void Listing::relist() {
  auto tree = list_source(parts_, *client_);
  std::lock_guard lock(mutex_);
  tree_ = std::move(tree);  // Files opened from the old listing keep what it showed
}

Listing::Found Listing::find(const std::filesystem::path& path) const {
  const auto parts = components(path.native());
  if (!is_s3_path(path) || parts.size() < parts_.size() ||
      !std::equal(parts_.begin(), parts_.end(), parts.begin()))
    throw SourceError(fmt::format("{}: not below the object-store source {}", path.string(), root_.string()));
  std::lock_guard lock(mutex_);
  return {tree_, joined(parts, parts_.size())};
}

Kind Listing::kind(const std::filesystem::path& path) const {
  const Found f = find(path);
  if (f.tree->dirs.contains(f.relative)) return Kind::directory;
  return f.tree->files.contains(f.relative) ? Kind::file : Kind::none;
}

std::optional<Object> Listing::object(const std::filesystem::path& path) const {
  const Found f = find(path);
  const auto it = f.tree->files.find(f.relative);
  if (it == f.tree->files.end() || f.tree->dirs.contains(f.relative)) return std::nullopt;
  return Object{cache_, parts_[0], it->second};
}

std::map<std::string, bool> Listing::children(const std::filesystem::path& path) const {
  const Found f = find(path);
  const auto it = f.tree->dirs.find(f.relative);
  return it == f.tree->dirs.end() ? std::map<std::string, bool>{} : it->second;
}

}  // namespace ckptfs::io::remote_tree
