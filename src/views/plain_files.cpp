// Virtual files that are not assembled from tensors: bytes held in memory, and source files as they are.
#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <stdexcept>

#include "ckptfs/views.hpp"

namespace ckptfs::views {

namespace {

class BytesFile final : public VirtualFile {
 public:
  explicit BytesFile(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > bytes_.size() || dst.size() > bytes_.size() - offset)
      throw std::out_of_range(
          fmt::format("read of {} bytes at {} past the end ({} bytes)", dst.size(), offset, bytes_.size()));
    std::memcpy(dst.data(), bytes_.data() + offset, dst.size());
  }

 private:
  std::string bytes_;
};

class PassthroughFile final : public VirtualFile {
 public:
  explicit PassthroughFile(io::FilePtr file) : file_(std::move(file)) {}
  uint64_t size() const override { return file_->size(); }
  void read(uint64_t offset, std::span<std::byte> dst) const override { file_->read_exact(offset, dst); }
  void read_deferring(uint64_t offset, std::span<std::byte> dst,
                      std::vector<catalog::DeferredRun>& deferred) const override {
    std::optional<io::DiskFileRef> on_disk;
    if (dst.size() < catalog::kMinDeferredRun || !(on_disk = io::DiskFileRef::of(file_)))
      return read(offset, dst);  // an object or a decoded item: no fd
    if (offset > file_->size() || dst.size() > file_->size() - offset)
      return read(offset, dst);  // read says why
    deferred.push_back({catalog::FileBytes{std::move(*on_disk), offset}, dst.data(), dst.size()});
  }
  std::vector<io::FilePtr> sources() const override { return {file_}; }
  void prefetch(uint64_t offset, uint64_t length) const override { file_->prefetch(offset, length); }
  void append_source_runs(std::vector<catalog::Piece>& out) const override {
    out.push_back({0, file_->size(), file_, 0, DType::U8});  // the whole file, a byte per element
  }

 private:
  io::FilePtr file_;
};

class LiveFile final : public VirtualFile {
 public:
  explicit LiveFile(std::function<std::string()> make) : make_(std::move(make)) {}
  uint64_t size() const override { return 0; }
  void read(uint64_t, std::span<std::byte>) const override {}  // only [0, 0): its bytes are per open
  std::shared_ptr<const VirtualFile> open_layout() const override { return make_bytes_file(make_()); }
  bool live() const override { return true; }

 private:
  std::function<std::string()> make_;
};

}  // namespace

VirtualFilePtr make_live_file(std::function<std::string()> make) {
  return std::make_shared<LiveFile>(std::move(make));
}

VirtualFilePtr make_bytes_file(std::string bytes) {
  return std::make_shared<BytesFile>(std::move(bytes));
}

VirtualFilePtr make_passthrough(io::FilePtr file) {
  return std::make_shared<PassthroughFile>(std::move(file));
}

}  // namespace ckptfs::views
