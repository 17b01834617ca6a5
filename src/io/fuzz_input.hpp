// For the fuzz targets (src/**/*_fuzz.cpp): the input bytes as a source file (an anonymous in-memory
// file reached through /proc/self/fd), since the parsers read io::Files.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "ckptfs/io.hpp"
#include "io/runtime.hpp"

namespace ckptfs::io {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : fd_(::memfd_create("ckptfs-fuzz", 0)) {
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~FuzzInput() { ::close(fd_); }
  FuzzInput(const FuzzInput&) = delete;
  FuzzInput& operator=(const FuzzInput&) = delete;

  const std::string& path() const { return path_; }
  FilePtr open() const { return File::open_standalone(path_); }
  // A source for the parsers that take one: the local file system, its files read through caches of its own.
  const Source& source() const { return *source_; }
  // The input under `name` in a directory of this process's own (for parsers that go by file names):
  // a symlink, replaced by the next input's.
  std::filesystem::path link_as(const std::string& name) const {
    static const std::filesystem::path dir = [] {
      std::string pattern = (std::filesystem::temp_directory_path() / "ckptfs-fuzz-XXXXXX").string();
      return std::filesystem::path(::mkdtemp(pattern.data()));
    }();
    const std::filesystem::path link = dir / name;
    std::error_code ec;
    std::filesystem::remove(link, ec);
    std::filesystem::create_symlink(path_, link, ec);
    return link;
  }

 private:
  int fd_;
  std::string path_;
  SourcePtr source_ = Runtime().open_local("/");
};

}  // namespace ckptfs::io
