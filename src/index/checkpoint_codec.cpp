#include "index/checkpoint_codec.hpp"

#include <set>
#include <tuple>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

// What decides the tags besides the files the catalogs read: the directories walked (an added or
// removed entry changes a directory's mtime, or a remote directory's digest of names) and the regular
// files directly in them (a tracker file rewritten in place, or an object's new ETag).
struct Watched {
  fs::path path;
  io::PathState state;
};

std::optional<Watched> watch(const io::Source& source, const fs::path& path) {
  auto state = source.path_state(path);
  if (!state) return std::nullopt;
  return Watched{path, std::move(*state)};
}

bool same(const Watched& a, const Watched& b) {
  return a.state == b.state;
}

std::vector<Watched> watched_of(const io::Source& source, const Checkpoint& cp) {
  std::set<fs::path> dirs = {cp.root};
  for (const auto& tag : cp.tags) {
    dirs.insert(tag.dir);
    for (const auto& f : tag.files) dirs.insert(f.parent_path());
  }
  std::set<fs::path> paths = dirs;
  for (const auto& d : dirs) {
    for (const auto& e : source.list_directory(d))
      if (e.is_file) paths.insert(e.path);
  }
  std::vector<Watched> out;
  for (const auto& p : paths)
    if (auto w = watch(source, p)) out.push_back(std::move(*w));
  return out;
}

void check_unchanged(const io::Source& source, const std::vector<Watched>& watched) {
  for (const auto& w : watched)
    if (const auto now = watch(source, w.path); !now || !same(*now, w))
      throw StaleIndex(w.path.string() + " changed since it was indexed");
}

}  // namespace

template <>
struct Fields<io::PathState> {
  static auto of(auto& s) { return std::tie(s.directory, s.mtime_ns, s.inode, s.size, s.version); }
};
template <>
struct Fields<Watched> {
  static auto of(auto& w) { return std::tie(w.path, w.state); }
};

// The watched paths first: an index whose tags changed is found stale before anything else is read.
std::string encode_checkpoint(const io::Source& source, const Checkpoint& checkpoint) {
  Encoder out;
  out(watched_of(source, checkpoint), checkpoint);
  return out.take();
}

Checkpoint decode_checkpoint(std::span<const std::byte> data, io::SourcePtr source,
                             std::shared_ptr<catalog::TransposeCache> transpose_cache) {
  Decoder in(data);
  in.give(source);
  in.give(std::move(transpose_cache));
  std::vector<Watched> watched;
  in(watched);
  check_unchanged(*source, watched);
  Checkpoint checkpoint;
  in(checkpoint);
  in.finish();
  return checkpoint;
}

}  // namespace ckptfs::index
