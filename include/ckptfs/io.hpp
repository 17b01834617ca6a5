// Read-only access to source files: every source file is opened once, O_RDONLY, and read with pread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace ckptfs::io {

class File {
 public:
  // Opens `path` read-only. Throws SourceError naming the path when it cannot be opened.
  static std::shared_ptr<File> open(const std::filesystem::path& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  int64_t mtime_ns() const { return mtime_ns_; }

  // Reads exactly dst.size() bytes at `offset` (retrying on EINTR and short reads). Throws SourceError
  // naming the file on an I/O error or when the range runs past the end of the file.
  void read_exact(uint64_t offset, std::span<std::byte> dst) const;
  std::vector<std::byte> read(uint64_t offset, uint64_t length) const;

  // True while the file on disk still has the size and mtime it had when opened.
  bool unchanged() const;

 private:
  File(std::filesystem::path path, int fd, uint64_t size, int64_t mtime_ns);
  std::filesystem::path path_;
  int fd_;
  uint64_t size_;
  int64_t mtime_ns_;
};

using FilePtr = std::shared_ptr<File>;

// Opens each path once and hands out the same File for later requests.
class FileSet {
 public:
  FilePtr open(const std::filesystem::path& path);

 private:
  std::mutex mutex_;
  std::map<std::filesystem::path, FilePtr> files_;
};

}  // namespace ckptfs::io
