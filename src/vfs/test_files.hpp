// Hand-made virtual files and source files for the vfs and fuse tests.
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "ckptfs/error.hpp"
#include "ckptfs/views.hpp"

namespace ckptfs::testing {

// A virtual file holding `bytes` that claims to come from `sources`; with `fail`, every read throws
// SourceError as a vanished shard would.
class MemoryFile final : public views::VirtualFile {
 public:
  MemoryFile(std::string bytes, std::vector<io::FilePtr> sources, bool fail)
      : bytes_(std::move(bytes)), sources_(std::move(sources)), fail_(fail) {}
  uint64_t size() const override { return bytes_.size(); }
  std::vector<io::FilePtr> sources() const override { return sources_; }
  void read(uint64_t offset, std::span<std::byte> dst) const override {
    if (fail_) throw SourceError("/shards/rank0.pt: file shrank");
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }

 private:
  std::string bytes_;
  std::vector<io::FilePtr> sources_;
  bool fail_;
};

inline views::VirtualFilePtr memory_file(std::string bytes, std::vector<io::FilePtr> sources = {},
                                         bool fail = false) {
  return std::make_shared<MemoryFile>(std::move(bytes), std::move(sources), fail);
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ckptfs-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path_ / name, std::ios::binary) << bytes;
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace ckptfs::testing
