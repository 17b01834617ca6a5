// The listing of one object-store source (io::Source of an s3:// prefix): what its tree queries and opens
// answer for an s3:// path, held by the source rather than looked up by path.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/s3.hpp"
#include "io/remote_object.hpp"

namespace ckptfs::io::remote_tree {

// An object below the source, as its listing showed it.
struct Object {
  std::shared_ptr<const RemoteCache> cache;  // the source's, over its client
  std::string bucket;
  s3::ObjectInfo info;
};

enum class Kind { none, file, directory };

// True when `path` is spelled s3://...
bool is_s3_path(const std::filesystem::path& path);

struct Tree;  // one listing taken of the store

class Listing {
 public:
  // Lists every object under `url` once (ListObjectsV2, all pages), read through `cache`. Throws SourceError
  // (an s3::Error naming the URL and the S3 code) when the listing fails, and SourceError when nothing is
  // stored under the prefix.
  Listing(const s3::Url& url, std::shared_ptr<s3::Client> client, std::shared_ptr<const RemoteCache> cache);
  ~Listing();

  // s3://BUCKET/PREFIX, in its one spelling.
  const std::filesystem::path& root() const { return root_; }

  // What the listing shows at `path`. Throws SourceError when `path` is not this source or below it.
  Kind kind(const std::filesystem::path& path) const;
  std::optional<Object> object(const std::filesystem::path& path) const;
  // name -> is a directory; empty unless `path` is a directory.
  std::map<std::string, bool> children(const std::filesystem::path& path) const;

  // Lists the store again (throws as the constructor does): later lookups see it as it is now, files
  // opened from the old listing keep what it showed.
  void relist();

 private:
  struct Found {
    std::shared_ptr<const Tree> tree;
    std::string relative;
  };
  Found find(const std::filesystem::path& path) const;

  std::shared_ptr<s3::Client> client_;
  std::shared_ptr<const RemoteCache> cache_;
  std::vector<std::string> parts_;  // bucket, then the prefix's parts
  std::filesystem::path root_;
  mutable std::mutex mutex_;
  std::shared_ptr<const Tree> tree_;
};

}  // namespace ckptfs::io::remote_tree
