#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "ckptfs/views.hpp"

namespace ckptfs::views {

ExtentFile::ExtentFile(std::vector<Extent> extents, std::shared_ptr<const void> keep_alive)
    : keep_alive_(std::move(keep_alive)) {
  // Empty extents (zero-size tensors) are dropped so that every offset belongs to exactly one extent.
  std::erase_if(extents, [](const Extent& e) { return e.length == 0; });
  for (const Extent& e : extents) {
    if (e.offset != size_)
      throw std::invalid_argument(fmt::format("extent at {} does not start at {}", e.offset, size_));
    if (!e.tensor == !e.bytes)
      throw std::invalid_argument(fmt::format("extent at {} needs bytes or a tensor", e.offset));
    size_ += e.length;
  }
  extents_ = std::move(extents);
}

void ExtentFile::read(uint64_t offset, std::span<std::byte> dst) const {
  if (offset > size_ || dst.size() > size_ - offset)
    throw std::out_of_range(
        fmt::format("read of {} bytes at {} past the end ({} bytes)", dst.size(), offset, size_));
  auto it = std::upper_bound(extents_.begin(), extents_.end(), offset,
                             [](uint64_t off, const Extent& e) { return off < e.offset; });
  for (--it; !dst.empty(); ++it) {
    const uint64_t skip = offset - it->offset;
    const auto part = dst.first(std::min<uint64_t>(dst.size(), it->length - skip));
    if (it->tensor)
      catalog::read_tensor(*it->tensor, it->tensor_offset + skip, part);
    else
      std::memcpy(part.data(), it->bytes->data() + it->inline_offset + skip, part.size());
    offset += part.size();
    dst = dst.subspan(part.size());
  }
}

std::vector<io::FilePtr> distinct_sources(std::span<const catalog::LogicalTensor* const> tensors) {
  std::vector<io::FilePtr> files;
  std::unordered_set<const io::File*> seen;
  for (const auto* t : tensors)
    for (const auto& f : t->files())
      if (seen.insert(f.get()).second) files.push_back(f);
  return files;
}

std::vector<io::FilePtr> ExtentFile::sources() const {
  std::vector<const catalog::LogicalTensor*> tensors;
  for (const Extent& e : extents_)
    if (e.tensor) tensors.push_back(e.tensor);
  return distinct_sources(tensors);
}

}  // namespace ckptfs::views
