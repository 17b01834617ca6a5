// The listings of the object-store sources opened in this process (io::open_remote_source), looked up
// by path: what io_tree.hpp's functions and File::open answer for an s3:// path.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ckptfs/s3.hpp"
#include "io/remote_object.hpp"

namespace ckptfs::io::remote_tree {

// An object below a registered source, as its listing showed it.
struct Object {
  std::shared_ptr<const RemoteCache> cache;  // the source's, over its client
  std::string bucket;
  s3::ObjectInfo info;
};

enum class Kind { none, file, directory };

// True when `path` is spelled s3://...
bool is_s3_path(const std::filesystem::path& path);
// What the listing shows at `path`. Throws SourceError when no registered source holds it.
Kind kind(const std::filesystem::path& path);
std::optional<Object> object(const std::filesystem::path& path);
// name -> is a directory; empty unless `path` is a directory.
std::map<std::string, bool> children(const std::filesystem::path& path);

}  // namespace ckptfs::io::remote_tree
