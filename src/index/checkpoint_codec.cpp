#include "index/checkpoint_codec.hpp"

#include <sys/stat.h>

#include <set>

namespace ckptfs::index {

namespace fs = std::filesystem;

namespace {

// What decides the tags besides the files the catalogs read: the directories walked (an added or
// removed entry changes a directory's mtime) and the regular files directly in them (a tracker file
// rewritten in place).
struct Watched {
  fs::path path;
  bool directory = false;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
};

std::optional<Watched> watch(const fs::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return Watched{path, S_ISDIR(st.st_mode), st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec,
                 static_cast<uint64_t>(st.st_ino), S_ISDIR(st.st_mode) ? 0 : static_cast<uint64_t>(st.st_size)};
}

bool same(const Watched& a, const Watched& b) {
  return a.directory == b.directory && a.mtime_ns == b.mtime_ns && a.inode == b.inode && a.size == b.size;
}

std::vector<Watched> watched_of(const Checkpoint& cp) {
  std::set<fs::path> dirs = {cp.root};
  for (const auto& tag : cp.tags) {
    dirs.insert(tag.dir);
    for (const auto& f : tag.files) dirs.insert(f.parent_path());
  }
  std::set<fs::path> paths = dirs;
  for (const auto& d : dirs) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.is_regular_file(ec)) paths.insert(e.path());
  }
  std::vector<Watched> out;
  for (const auto& p : paths)
    if (auto w = watch(p)) out.push_back(std::move(*w));
  return out;
}

void check_unchanged(const std::vector<Watched>& watched) {
  for (const auto& w : watched)
    if (const auto now = watch(w.path); !now || !same(*now, w))
      throw StaleIndex(w.path.string() + " changed since it was indexed");
}

}  // namespace

template <>
struct Fields<Watched> {
  static void visit(auto& c, auto& w) { c(w.path, w.directory, w.mtime_ns, w.inode, w.size); }
};

// The watched paths first: an index whose tags changed is found stale before anything else is read.
std::string encode_checkpoint(const Checkpoint& checkpoint) {
  Encoder out;
  out(watched_of(checkpoint), checkpoint);
  return out.take();
}

Checkpoint decode_checkpoint(std::span<const std::byte> data) {
  Decoder in(data);
  std::vector<Watched> watched;
  in(watched);
  check_unchanged(watched);
  Checkpoint checkpoint;
  in(checkpoint);
  in.finish();
  return checkpoint;
}

}  // namespace ckptfs::index
