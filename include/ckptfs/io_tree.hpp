// The source tree as the adapters see it: which paths are files or directories, what a directory holds,
// the text of a small file. A local path answers from the file system (as std::filesystem does); a path
// below an object-store source (`s3://BUCKET/PREFIX/name`, spelled as a std::filesystem::path so that
// `/`, parent_path() and filename() work on it) answers from the one listing of the prefix taken when the
// source was opened (open_remote_source): directories are the key prefixes ending at a '/'. Nothing above
// io/ needs to know which kind a path is.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace ckptfs::s3 {
class Client;
struct Url;
}  // namespace ckptfs::s3

namespace ckptfs::io {

class Runtime;  // src/io/runtime.hpp

bool is_file(const std::filesystem::path& path);
bool is_directory(const std::filesystem::path& path);
bool exists(const std::filesystem::path& path);

struct DirectoryEntry {
  std::filesystem::path path;  // dir / name
  bool is_directory = false;
  bool is_file = false;  // a regular file (or an object); false for sockets, devices, broken links
};
// The entries of `dir` in no particular order; empty when it is not a directory or cannot be listed.
std::vector<DirectoryEntry> list_directory(const std::filesystem::path& dir);

// The whole content of the file at `path`; nullopt when it is not a file or cannot be opened. Throws
// FormatError naming the path when it holds more than `limit` bytes, SourceError when a read fails.
std::optional<std::string> read_small_file(const std::filesystem::path& path, uint64_t limit);

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
std::optional<PathState> path_state(const std::filesystem::path& path);

// Whether `path` names an object-store source or something below one (s3://...).
bool is_remote(const std::filesystem::path& path);

// std::filesystem::canonical for a local path (symlinks, `.`, `..` and trailing slashes resolved; `ec` set
// when it does not exist); a remote path as it is, already in its one spelling.
std::filesystem::path canonical(const std::filesystem::path& path, std::error_code& ec);

// Lists every object under `url` once (ListObjectsV2, all pages) and registers the listing, so that the
// functions above and File::open answer for paths below it; returns the source's path (url.str()). Its
// objects are read through a block cache of `runtime`'s. Throws SourceError (an s3::Error naming the URL and
// the S3 code) when the listing fails, and SourceError when nothing is stored under the prefix.
std::filesystem::path open_remote_source(const s3::Url& url, std::shared_ptr<s3::Client> client,
                                         Runtime& runtime);
// Lists the object-store source `source` (what open_remote_source returned) again: later lookups see the
// store as it is now (a live mount's refresh). Throws SourceError as open_remote_source does.
void relist_remote_source(const std::filesystem::path& source);

}  // namespace ckptfs::io
