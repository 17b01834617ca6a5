#include "vfs/source_access.hpp"

#include <sys/stat.h>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::vfs {

namespace fs = std::filesystem;

namespace {

constexpr mode_t kReadBits = 0444;

// r for every class that has r: a directory listable by a class is passable by it in the mount.
mode_t with_search_bits(mode_t read_bits) { return read_bits | (read_bits & kReadBits) >> 2; }

// Whether `path` is `dir` or below it.
bool is_within(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p)
    if (p == path.end() || *p != *d) return false;
  return true;
}

}  // namespace

SourceAccess::SourceAccess(const fs::path& src, io::Access unlisted) : unlisted_(unlisted) {
  boundary_ = src;
  if (!io::is_remote(src) && !io::is_directory(src)) boundary_ = src.parent_path();
}

io::Access SourceAccess::stat_access(const fs::path& path) {
  if (auto it = stats_.find(path); it != stats_.end()) return it->second;
  io::Access access;
  if (struct stat st {}; ::stat(path.c_str(), &st) == 0) access = {st.st_uid, st.st_gid, st.st_mode & 07777};
  return stats_.emplace(path, access).first->second;
}

mode_t SourceAccess::reachable_read_bits(const fs::path& dir, const io::Access& access) {
  mode_t bits = access.mode & kReadBits;
  if (!is_within(dir, boundary_)) return bits;
  for (fs::path d = dir;; d = d.parent_path()) {
    const io::Access above = stat_access(d);
    // The owner and group of `access` pass `d` as its owner or group where they are the same, else as others.
    if ((above.mode & (above.uid == access.uid ? 0100 : 0001)) == 0) bits &= ~mode_t{0400};
    if ((above.mode & (above.gid == access.gid ? 0010 : 0001)) == 0) bits &= ~mode_t{0040};
    if ((above.mode & 0001) == 0) bits &= ~mode_t{0004};
    if (d == boundary_ || !d.has_relative_path()) return bits;
  }
}

io::Access SourceAccess::directory(const fs::path& dir) {
  if (io::is_remote(dir)) return unlisted_;
  fs::path d = dir;
  io::Access access = stat_access(d);
  if (!io::is_directory(d)) access = stat_access(d = d.parent_path());
  access.mode = with_search_bits(d == boundary_ ? access.mode & kReadBits : reachable_read_bits(d.parent_path(), access));
  return access;
}

io::Access SourceAccess::of_source(const io::File& source) {
  if (auto it = sources_.find(&source); it != sources_.end()) return it->second;
  io::Access access{unlisted_.uid, unlisted_.gid, unlisted_.mode & kReadBits};
  if (const auto on_disk = source.access()) {
    access = *on_disk;
    access.mode = reachable_read_bits(source.path().parent_path(), access);
  }
  return sources_.emplace(&source, access).first->second;
}

std::optional<io::Access> SourceAccess::file(const std::vector<io::FilePtr>& sources) {
  if (sources.empty()) return std::nullopt;
  io::Access out = of_source(*sources.front());
  bool same_owner = true, same_group = true;
  for (const auto& source : sources) {
    const io::Access one = of_source(*source);
    out.mode &= one.mode;
    same_owner = same_owner && one.uid == out.uid;
    same_group = same_group && one.gid == out.gid;
  }
  if (!same_owner || !same_group) {
    const io::Access src = directory(boundary_);
    if (!same_owner) out.uid = src.uid;
    if (!same_group) out.gid = src.gid;
  }
  return out;
}

}  // namespace ckptfs::vfs
