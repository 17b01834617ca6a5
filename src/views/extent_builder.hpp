// Lays out a virtual file front to back: inline bytes (gathered into one shared string) and whole tensors.
#pragma once

#include <memory>
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
    if (extents_.empty() || extents_.back().tensor) {
      Extent& e = extents_.emplace_back();
      e.offset = offset_;
      e.inline_offset = inline_.size();
    }
    extents_.back().length += bytes.size();
    inline_ += bytes;
    offset_ += bytes.size();
  }

  void append(const catalog::TensorRef& tensor) {
    const uint64_t nbytes = tensor->nbytes();
    if (nbytes == 0) return;
    Extent& e = extents_.emplace_back();
    e.offset = offset_;
    e.length = nbytes;
    e.tensor = tensor;
    offset_ += nbytes;
  }

  std::vector<Extent> finish() && {
    auto bytes = std::make_shared<const std::string>(std::move(inline_));
    for (Extent& e : extents_)
      if (!e.tensor) e.bytes = bytes;
    return std::move(extents_);
  }

 private:
  std::string inline_;
  std::vector<Extent> extents_;
  uint64_t offset_ = 0;
};

}  // namespace ckptfs::views
