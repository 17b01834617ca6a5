#include "io/remote_object.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace ckptfs::io {

RemoteReader::RemoteReader(std::shared_ptr<s3::Client> client, std::string bucket, s3::ObjectInfo info)
    : client_(std::move(client)), bucket_(std::move(bucket)), info_(std::move(info)) {}

std::string RemoteReader::url() const { return fmt::format("s3://{}/{}", bucket_, info_.key); }

void RemoteReader::fetch(uint64_t offset, std::span<std::byte> dst) const {
  try {
    client_->get_range(bucket_, info_.key, offset, dst.size(), info_.etag, dst.data());
  } catch (const s3::ObjectChangedError&) {
    throw SourceError(fmt::format("{}: changed since the mount (the store no longer has ETag {}); remount to "
                                  "serve the new checkpoint",
                                  url(), info_.etag));
  }
}

void RemoteReader::read(uint64_t offset, std::span<std::byte> dst) const {
  if (dst.size() > kSmallRemoteRead) return fetch(offset, dst);
  std::lock_guard lock(mutex_);
  const auto holds = [&] { return offset >= block_offset_ && offset + dst.size() <= block_offset_ + block_.size(); };
  if (!holds()) {
    const uint64_t size = info_.size;
    uint64_t start = offset;
    uint64_t end = std::min(size, offset + std::max<uint64_t>(dst.size(), kReadAheadBlock));
    if (size - offset <= kReadAheadSuffix) {  // near the end: the whole suffix
      start = std::min(offset, size - std::min(size, kReadAheadSuffix));
      end = size;
    }
    std::vector<std::byte> block(end - start);
    fetch(start, block);
    block_ = std::move(block);
    block_offset_ = start;
  }
  std::memcpy(dst.data(), block_.data() + (offset - block_offset_), dst.size());
}

void RemoteReader::prefetch(uint64_t, uint64_t) const {}

}  // namespace ckptfs::io
