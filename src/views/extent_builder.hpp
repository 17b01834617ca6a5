// Lays out a virtual file front to back: inline bytes (gathered into one shared string) and whole tensors.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/views.hpp"

namespace ckptfs::views {

class ExtentBuilder {
 public:
  uint64_t offset() const { return offset_; }

  void append(std::string_view bytes) {
    if (bytes.empty()) return;
    if (!open_bytes_)
      open_bytes_ = Extent{.offset = offset_, .source = InlineBytes{inline_, inline_->size()}};
    open_bytes_->length += bytes.size();
    *inline_ += bytes;
    offset_ += bytes.size();
  }

  void append(const catalog::TensorRef& tensor) {
    const uint64_t nbytes = tensor->nbytes();
    if (nbytes == 0) return;
    close_bytes();
    extents_.push_back({.offset = offset_, .length = nbytes, .source = TensorBytes{tensor}});
    offset_ += nbytes;
  }

  std::vector<Extent> finish() && {
    close_bytes();
    return std::move(extents_);
  }

 private:
  void close_bytes() {
    if (open_bytes_) extents_.push_back(*std::move(open_bytes_));
    open_bytes_.reset();
  }

  // Every inline extent points into this string, which grows until finish().
  std::shared_ptr<std::string> inline_ = std::make_shared<std::string>();
  std::vector<Extent> extents_;
  std::optional<Extent> open_bytes_;  // the inline extent that bytes appended next extend
  uint64_t offset_ = 0;
};

}  // namespace ckptfs::views
