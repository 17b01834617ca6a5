// A source as the adapters see it (io::Source, made by the command's io::Runtime and handed down to what
// reads it): which paths are files or directories, what a directory holds, the text of a small file, and
// its files opened to read through the Runtime's caches. A local path answers from the file system (as
// std::filesystem does); a path below an object-store source (`s3://BUCKET/PREFIX/name`, spelled as a
// std::filesystem::path so that `/`, parent_path() and filename() work on it) answers from the one listing
// of the prefix taken when the source was opened (Runtime::open_remote), or last relisted: directories are
// the key prefixes ending at a '/'. Nothing above io/ needs to know which kind a path is.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "ckptfs/io.hpp"

namespace ckptfs::io {

namespace remote_tree {
class Listing;  // src/io/remote_tree.hpp
}

struct DirectoryEntry {
  std::filesystem::path path;  // dir / name
  bool is_directory = false;
  bool is_file = false;  // a regular file (or an object); false for sockets, devices, broken links
};

// What decides whether an index of the tree is still current: for a local path its stat (mtime, inode,
// size); for a remote one the listing's ETag and size of an object, and for a directory a digest of the
// names below it (an object added or removed changes it).
struct PathState {
  bool directory = false;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  std::string version;  // remote: the ETag, or the directory's digest; "" for local paths
  bool operator==(const PathState&) const = default;
};

// One source a command opened: a local directory or file, or an s3:// prefix with its listing and block
// cache. A path spelled s3:// answers from the listing (SourceError when this source is local or the path
// lies outside its prefix); any other from the file system. Safe to query from many threads, also while a
// live mount relists it.
class Source {
 public:
  Source(std::filesystem::path root, std::shared_ptr<SourceCaches> caches,
         std::shared_ptr<remote_tree::Listing> listing = nullptr);
  ~Source();
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // The source's path: absolute for a local one, s3://BUCKET/PREFIX for a remote one.
  const std::filesystem::path& root() const { return root_; }
  // Whether it is an object-store source (every path below it is s3://...).
  bool is_remote() const { return listing_ != nullptr; }

  bool is_file(const std::filesystem::path& path) const;
  bool is_directory(const std::filesystem::path& path) const;
  bool exists(const std::filesystem::path& path) const;
  // The entries of `dir` in no particular order; empty when it is not a directory or cannot be listed.
  std::vector<DirectoryEntry> list_directory(const std::filesystem::path& dir) const;
  // The whole content of the file at `path`; nullopt when it is not a file or cannot be opened. Throws
  // FormatError naming the path when it holds more than `limit` bytes, SourceError when a read fails.
  std::optional<std::string> read_small_file(const std::filesystem::path& path, uint64_t limit) const;
  std::optional<PathState> path_state(const std::filesystem::path& path) const;
  // std::filesystem::canonical for a local path (symlinks, `.`, `..` and trailing slashes resolved; `ec`
  // set when it does not exist); a remote path as it is, already in its one spelling.
  std::filesystem::path canonical(const std::filesystem::path& path, std::error_code& ec) const;

  // Opens `path` read-only (File::open) through the caches of the Runtime that opened this source; a remote
  // path is its object, with the identity the listing showed: opening sends no request. Throws SourceError
  // naming the path when it cannot be opened or is not a regular file (or object).
  FilePtr open(const std::filesystem::path& path) const;

  // Lists a remote source again: later lookups see the store as it is now (a live mount's refresh); files
  // opened before keep what the old listing showed. Nothing for a local source. Throws SourceError (an
  // s3::Error naming the URL and the S3 code) when the listing fails or nothing is stored under the prefix.
  void relist() const;

 private:
  std::filesystem::path root_;
  std::shared_ptr<SourceCaches> caches_;
  std::shared_ptr<remote_tree::Listing> listing_;  // null for a local source
};

using SourcePtr = std::shared_ptr<const Source>;

}  // namespace ckptfs::io
