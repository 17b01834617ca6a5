// io_tree.hpp: local paths through std::filesystem, s3:// paths through the source's listing.
#include <fmt/format.h>
#include <sys/stat.h>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/io_tree.hpp"
#include "io/remote_object.hpp"
#include "io/remote_tree.hpp"

namespace ckptfs::io {

namespace fs = std::filesystem;

namespace {

std::string human_size(uint64_t bytes) {
  if (bytes % (uint64_t{1} << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes % (uint64_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

// A path spelled s3:// is asked of the listing, which refuses it when this source is local.
const remote_tree::Listing& listing_of(const std::shared_ptr<remote_tree::Listing>& listing,
                                       const fs::path& path) {
  if (!listing)
    throw SourceError(
        fmt::format("{}: not below an object-store source opened by this command", path.string()));
  return *listing;
}

}  // namespace

Source::Source(fs::path root, std::shared_ptr<SourceCaches> caches,
               std::shared_ptr<remote_tree::Listing> listing)
    : root_(std::move(root)), caches_(std::move(caches)), listing_(std::move(listing)) {}

Source::~Source() = default;

fs::path Source::canonical(const fs::path& path, std::error_code& ec) const {
  ec.clear();
  return remote_tree::is_s3_path(path) ? path : fs::canonical(path, ec);
}

bool Source::is_file(const fs::path& path) const {
  if (remote_tree::is_s3_path(path)) return listing_of(listing_, path).kind(path) == remote_tree::Kind::file;
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool Source::is_directory(const fs::path& path) const {
  if (remote_tree::is_s3_path(path))
    return listing_of(listing_, path).kind(path) == remote_tree::Kind::directory;
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool Source::exists(const fs::path& path) const {
  if (remote_tree::is_s3_path(path)) return listing_of(listing_, path).kind(path) != remote_tree::Kind::none;
  std::error_code ec;
  return fs::exists(path, ec);
}

std::vector<DirectoryEntry> Source::list_directory(const fs::path& dir) const {
  std::vector<DirectoryEntry> out;
  if (remote_tree::is_s3_path(dir)) {
    for (const auto& [name, is_dir] : listing_of(listing_, dir).children(dir))
      out.push_back({dir / name, is_dir, !is_dir});
    return out;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code entry_ec;
    const bool is_dir = entry.is_directory(entry_ec);
    out.push_back({entry.path(), is_dir, !is_dir && entry.is_regular_file(entry_ec)});
  }
  return out;
}

std::optional<std::string> Source::read_small_file(const fs::path& path, uint64_t limit) const {
  if (!is_file(path)) return std::nullopt;
  FilePtr file;
  try {
    file = open(path);
  } catch (const SourceError&) {
    return std::nullopt;
  }
  if (file->size() > limit)
    throw FormatError(fmt::format("{}: larger than {}", path.string(), human_size(limit)));
  const auto bytes = file->read(0, file->size());
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::optional<PathState> Source::path_state(const fs::path& path) const {
  if (remote_tree::is_s3_path(path)) {
    const auto& listing = listing_of(listing_, path);
    switch (listing.kind(path)) {
      case remote_tree::Kind::none:
        return std::nullopt;
      case remote_tree::Kind::file: {
        const auto object = listing.object(path);
        return PathState{false, 0, 0, object->info.size, object->info.etag};
      }
      case remote_tree::Kind::directory: {
        std::string names;
        for (const auto& [name, is_dir] : listing.children(path)) names += name + (is_dir ? "/\n" : "\n");
        return PathState{true, 0, 0, 0, fmt::format("{:016x}", std::hash<std::string>{}(names))};
      }
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return PathState{S_ISDIR(st.st_mode), st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec,
                   static_cast<uint64_t>(st.st_ino),
                   S_ISDIR(st.st_mode) ? 0 : static_cast<uint64_t>(st.st_size), ""};
}

FilePtr Source::open(const fs::path& path) const {
  if (!remote_tree::is_s3_path(path)) return File::open(path, caches_);
  auto object = listing_of(listing_, path).object(path);
  if (!object)
    throw SourceError(fmt::format("{}: no such object in the listing taken at the mount", path.string()));
  FileIdentity identity;
  identity.size = object->info.size;
  identity.etag = object->info.etag;
  identity.last_modified = object->info.last_modified;
  return File::object(path, std::move(identity),
                      std::make_shared<RemoteReader>(object->cache, object->bucket, object->info), caches_);
}

void Source::relist() const {
  if (listing_) listing_->relist();
}

}  // namespace ckptfs::io
