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

RemoteReader::Block RemoteReader::fetch_block(uint64_t offset, uint64_t length) const {
  Block block{offset, std::vector<std::byte>(length)};
  fetch(offset, block.bytes);
  return block;
}

void RemoteReader::read(uint64_t offset, std::span<std::byte> dst) const {
  if (dst.size() > kSmallRemoteRead) return fetch(offset, dst);
  const uint64_t size = info_.size;
  const uint64_t suffix_start = size - std::min(size, kReadAheadSuffix);
  std::lock_guard lock(mutex_);
  const Block* from = nullptr;
  if (offset >= suffix_start) {
    if (suffix_.bytes.empty()) suffix_ = fetch_block(suffix_start, size - suffix_start);
    from = &suffix_;
  } else {
    if (!block_.holds(offset, dst.size()))
      block_ = fetch_block(offset, std::min(size, offset + std::max<uint64_t>(dst.size(), kReadAheadBlock)) - offset);
    from = &block_;
  }
  std::memcpy(dst.data(), from->bytes.data() + (offset - from->offset), dst.size());
}

void RemoteReader::prefetch(uint64_t, uint64_t) const {}

}  // namespace ckptfs::io
