// Who may read a node of the mount, from the sources it is made of (docs/mount.md#permissions): the mount
// never gives anyone more than the source files do. A file's read bits are those every source grants, each
// masked by the search bits of the directories on its way from / (as written, and as its symbolic links
// resolve: a class that cannot pass one of them cannot reach the file on disk); a directory shows the read
// bits of the source directory it stands for, so masked, with x wherever r.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include "ckptfs/io.hpp"

namespace ckptfs::vfs {

class SourceAccess {
 public:
  // `src`: the checkpoint's root (a directory, or a lone file whose directory then counts: its owner and
  // group stand in for sources that share none). `unlisted`: the owner, group and directory mode of what
  // has no POSIX modes (an object store's objects and prefixes), which every directory of a `remote` SRC
  // (io::Source::is_remote) takes.
  SourceAccess(const std::filesystem::path& src, bool remote, io::Access unlisted);

  // The access of a mount directory standing for source directory `dir` (a file: its directory).
  io::Access directory(const std::filesystem::path& dir);
  // The access of a file made of `sources`: the owner and group they share (else SRC's), the read bits all
  // of them grant. nullopt when there are none (the file then takes its directory's).
  std::optional<io::Access> file(const std::vector<io::FilePtr>& sources);

 private:
  // What stat shows for `path` (mode 0 when it cannot be stat'ed: nobody but root passes).
  io::Access stat_access(const std::filesystem::path& path);
  // `access`'s read bits (those of `path`), less those of a class that lacks x on a directory above `path`,
  // as written and as its symbolic links resolve.
  mode_t reachable_read_bits(const std::filesystem::path& path, const io::Access& access);
  // `bits` less those of a class of `access` that lacks x on `dir` or a directory above it, as written.
  mode_t passable_bits(std::filesystem::path dir, const io::Access& access, mode_t bits);
  io::Access of_source(const io::File& source);
  // The directory `path` lies in once every symbolic link on the way, and `path` itself if one, is resolved.
  std::filesystem::path resolved_parent(const std::filesystem::path& path);

  std::filesystem::path src_dir_;  // SRC's directory
  bool remote_;
  io::Access unlisted_;
  std::map<std::filesystem::path, io::Access> stats_;
  std::map<const io::File*, io::Access> sources_;
  std::map<std::filesystem::path, std::filesystem::path> resolved_dirs_;
};

}  // namespace ckptfs::vfs
