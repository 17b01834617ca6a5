// io_tree.hpp: local paths through std::filesystem, s3:// paths through their source's listing.
#include <fmt/format.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/io_tree.hpp"
#include "io/remote_tree.hpp"

namespace ckptfs::io {

namespace fs = std::filesystem;

namespace {

std::string human_size(uint64_t bytes) {
  if (bytes % (uint64_t{1} << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes % (uint64_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

}  // namespace

bool is_remote(const fs::path& path) {
  return remote_tree::is_s3_path(path);
}

fs::path canonical(const fs::path& path, std::error_code& ec) {
  ec.clear();
  return is_remote(path) ? path : fs::canonical(path, ec);
}

bool is_file(const fs::path& path) {
  if (is_remote(path)) return remote_tree::kind(path) == remote_tree::Kind::file;
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool is_directory(const fs::path& path) {
  if (is_remote(path)) return remote_tree::kind(path) == remote_tree::Kind::directory;
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool exists(const fs::path& path) {
  if (is_remote(path)) return remote_tree::kind(path) != remote_tree::Kind::none;
  std::error_code ec;
  return fs::exists(path, ec);
}

std::vector<DirectoryEntry> list_directory(const fs::path& dir) {
  std::vector<DirectoryEntry> out;
  if (is_remote(dir)) {
    for (const auto& [name, is_dir] : remote_tree::children(dir))
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

std::optional<std::string> read_small_file(const fs::path& path, uint64_t limit) {
  if (!is_file(path)) return std::nullopt;
  FilePtr file;
  try {
    file = File::open(path);
  } catch (const SourceError&) {
    return std::nullopt;
  }
  if (file->size() > limit)
    throw FormatError(fmt::format("{}: larger than {}", path.string(), human_size(limit)));
  const auto bytes = file->read(0, file->size());
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::optional<PathState> path_state(const fs::path& path) {
  if (is_remote(path)) {
    switch (remote_tree::kind(path)) {
      case remote_tree::Kind::none:
        return std::nullopt;
      case remote_tree::Kind::file: {
        const auto object = remote_tree::object(path);
        return PathState{false, 0, 0, object->info.size, object->info.etag};
      }
      case remote_tree::Kind::directory: {
        std::string names;
        for (const auto& [name, is_dir] : remote_tree::children(path))
          names += name + (is_dir ? "/\n" : "\n");
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

}  // namespace ckptfs::io
