#include "vfs/source_access.hpp"

#include <sys/stat.h>

namespace ckptfs::vfs {

namespace fs = std::filesystem;

namespace {

constexpr mode_t kReadBits = 0444;

// r for every class that has r: a directory listable by a class is passable by it in the mount.
mode_t with_search_bits(mode_t read_bits) {
  return read_bits | (read_bits & kReadBits) >> 2;
}

}  // namespace

SourceAccess::SourceAccess(const fs::path& src, bool remote, io::Access unlisted)
    : remote_(remote), unlisted_(unlisted) {
  src_dir_ = src;
  std::error_code ec;
  if (!remote && !fs::is_directory(src, ec)) src_dir_ = src.parent_path();
}

io::Access SourceAccess::stat_access(const fs::path& path) {
  if (auto it = stats_.find(path); it != stats_.end()) return it->second;
  io::Access access;
  if (struct stat st{}; ::stat(path.c_str(), &st) == 0) access = {st.st_uid, st.st_gid, st.st_mode & 07777};
  return stats_.emplace(path, access).first->second;
}

mode_t SourceAccess::passable_bits(fs::path dir, const io::Access& access, mode_t bits) {
  for (;; dir = dir.parent_path()) {
    const io::Access above = stat_access(dir);
    // The owner and group of `access` pass `dir` as its owner or group where they are the same, else as
    // others.
    if ((above.mode & (above.uid == access.uid ? 0100 : 0001)) == 0) bits &= ~mode_t{0400};
    if ((above.mode & (above.gid == access.gid ? 0010 : 0001)) == 0) bits &= ~mode_t{0040};
    if ((above.mode & 0001) == 0) bits &= ~mode_t{0004};
    if (!dir.has_relative_path()) return bits;
  }
}

fs::path SourceAccess::resolved_parent(const fs::path& path) {
  struct stat st {};
  std::error_code ec;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return fs::canonical(path, ec).parent_path();
  const fs::path parent = path.parent_path();
  if (auto it = resolved_dirs_.find(parent); it != resolved_dirs_.end()) return it->second;
  fs::path resolved = fs::canonical(parent, ec);
  return resolved_dirs_.emplace(parent, ec ? parent : resolved).first->second;
}

mode_t SourceAccess::reachable_read_bits(const fs::path& path, const io::Access& access) {
  mode_t bits = access.mode & kReadBits;
  if (!path.has_relative_path()) return bits;
  bits = passable_bits(path.parent_path(), access, bits);
  if (const fs::path resolved = resolved_parent(path); !resolved.empty() && resolved != path.parent_path())
    bits = passable_bits(resolved, access, bits);
  return bits;
}

io::Access SourceAccess::directory(const fs::path& dir) {
  if (remote_) return unlisted_;
  std::error_code ec;
  const fs::path d = fs::is_directory(dir, ec) ? dir : dir.parent_path();
  io::Access access = stat_access(d);
  access.mode = with_search_bits(reachable_read_bits(d, access));
  return access;
}

io::Access SourceAccess::of_source(const io::File& source) {
  if (auto it = sources_.find(&source); it != sources_.end()) return it->second;
  io::Access access{unlisted_.uid, unlisted_.gid, unlisted_.mode & kReadBits};
  if (const auto on_disk = source.access()) {
    access = *on_disk;
    access.mode = reachable_read_bits(source.path(), access);
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
    const io::Access src = stat_access(src_dir_);
    if (!same_owner) out.uid = src.uid;
    if (!same_group) out.gid = src.gid;
  }
  return out;
}

}  // namespace ckptfs::vfs
