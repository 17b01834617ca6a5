#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/io_tree.hpp"
#include "io/decoded_item.hpp"
#include "io/expectation.hpp"
#include "io/fd_cache.hpp"
#include "io/remote_object.hpp"
#include "io/remote_tree.hpp"
#include "io/source_caches.hpp"

namespace ckptfs::io {

namespace {

// The descriptor side of a file read from disk; null for a decoded item or an object.
const OnDisk* on_disk_of(const Origin& origin) {
  return std::visit(Overloaded{
                        [](const OnDisk& disk) { return &disk; },
                        [](const Decoded&) -> const OnDisk* { return nullptr; },
                        [](const Remote&) -> const OnDisk* { return nullptr; },
                    },
                    origin);
}

}  // namespace

File::File(std::filesystem::path path, FileIdentity identity, std::shared_ptr<SourceCaches> caches)
    : path_(std::move(path)), identity_(std::move(identity)), caches_(std::move(caches)) {}

File::~File() {
  if (const OnDisk* disk = on_disk_of(origin_); disk != nullptr && disk->slot)
    caches_->descriptors.forget(*disk->slot);
}

std::shared_ptr<File> File::open(const std::filesystem::path& path, std::shared_ptr<SourceCaches> caches) {
  auto [fd, identity, access] = open_source(path);
  std::shared_ptr<File> file(new File(path, identity, std::move(caches)));
  OnDisk disk{std::make_shared<DescriptorSlot>(), file->caches_->readahead.bytes(identity.device), access};
  file->caches_->descriptors.insert(*disk.slot, std::move(fd));  // the indexing that follows reads it at once
  file->origin_ = std::move(disk);
  return file;
}

std::shared_ptr<File> File::open_standalone(const std::filesystem::path& path) {
  return open(path, std::make_shared<SourceCaches>(1, true, kDefaultDecodedCacheBytes));
}

std::shared_ptr<File> File::object(std::filesystem::path path, FileIdentity identity,
                                   std::shared_ptr<RemoteReader> reader,
                                   std::shared_ptr<SourceCaches> caches) {
  std::shared_ptr<File> file(new File(std::move(path), std::move(identity), std::move(caches)));
  file->origin_ = Remote{std::move(reader)};
  return file;
}

const OnDisk& File::on_disk() const {
  const OnDisk* disk = on_disk_of(origin_);
  if (disk == nullptr)
    throw std::logic_error(path_.string() + ": has no descriptor (a decoded item or an object)");
  return *disk;
}

std::shared_ptr<File> File::decoded(std::shared_ptr<const DecodedItem> item) {
  FileIdentity identity = item->backing()->identity();
  identity.size = item->size();
  std::shared_ptr<File> file(new File(item->backing()->path(), identity, item->backing()->caches_));
  file->origin_ = Decoded{std::move(item)};
  return file;
}

void File::read_exact(uint64_t offset, std::span<std::byte> dst) const {
  const uint64_t size = identity_.size;
  if (offset > size || dst.size() > size - offset) {
    throw SourceError(fmt::format("{}: read of {} bytes at offset {} runs past the end ({} bytes)",
                                  path_.string(), dst.size(), offset, size));
  }
  if (dst.empty()) return;
  std::visit(Overloaded{
                 [&](const OnDisk& disk) { read_on_disk(disk, offset, dst); },
                 [&](const Decoded& decoded) { decoded.item->read(offset, dst); },
                 [&](const Remote& remote) { remote.reader->read(offset, dst); },
             },
             origin_);
}

void File::read_on_disk(const OnDisk& disk, uint64_t offset, std::span<std::byte> dst) const {
  const uint64_t size = identity_.size;
  const OpenFdPtr fd = caches_->descriptors.acquire(*this, *disk.slot);
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd->get(), dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SourceError(fmt::format("{}: read error at offset {}: {}", path_.string(), offset + done,
                                    std::strerror(errno)));
    }
    if (n == 0) {
      throw SourceError(fmt::format("{}: file shrank: no data at offset {} (was {} bytes)", path_.string(),
                                    offset + done, size));
    }
    done += static_cast<size_t>(n);
  }
}

std::vector<std::byte> File::read(uint64_t offset, uint64_t length) const {
  if (offset > identity_.size || length > identity_.size - offset) {
    throw SourceError(fmt::format("{}: read of {} bytes at offset {} runs past the end ({} bytes)",
                                  path_.string(), length, offset, identity_.size));
  }
  std::vector<std::byte> out(length);
  read_exact(offset, out);
  return out;
}

std::optional<Access> File::access() const {
  return std::visit(Overloaded{
                        [](const OnDisk& disk) { return std::optional<Access>(disk.access); },
                        [](const Decoded& decoded) { return decoded.item->backing()->access(); },
                        [](const Remote&) { return std::optional<Access>(); },
                    },
                    origin_);
}

std::optional<DiskFileRef> DiskFileRef::of(FilePtr file) {
  if (on_disk_of(file->origin_) == nullptr) return std::nullopt;
  return DiskFileRef(std::move(file));
}

OpenFdPtr DiskFileRef::descriptor() const {
  return file_->caches_->descriptors.acquire(*file_, *file_->on_disk().slot);
}

void DiskFileRef::check_descriptor(const OpenFd& fd) const {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw SourceError(
        fmt::format("{}: cannot stat its open descriptor: {}", file_->path_.string(), std::strerror(errno)));
  const FileIdentity now = identity_of(st);
  if (now != file_->identity_)
    throw SourceError(
        fmt::format("{}: changed since the mount ({} bytes, was {}; or its mtime or ctime differ); "
                    "remount to serve the new checkpoint",
                    file_->path_.string(), now.size, file_->identity_.size));
}

void File::prefetch(uint64_t offset, uint64_t length) const {
  if (offset >= identity_.size || length == 0) return;
  std::visit(Overloaded{
                 [&](const OnDisk& disk) { prefetch_on_disk(disk, offset, length); },
                 [](const Decoded& decoded) { decoded.item->prefetch(); },
                 [&](const Remote& remote) { remote.reader->prefetch(offset, length); },
             },
             origin_);
}

void File::prefetch_on_disk(const OnDisk& disk, uint64_t offset, uint64_t length) const {
  try {
    const OpenFdPtr fd = caches_->descriptors.acquire(*this, *disk.slot);
    // One call starts at most the device's readahead (128 KiB on FUSE or NFS): advise piece by piece.
    const uint64_t step = disk.readahead_bytes;
    const uint64_t end = offset + std::min(length, identity_.size - offset);
    for (uint64_t at = offset; at < end; at += step)
      ::posix_fadvise(fd->get(), static_cast<off_t>(at), static_cast<off_t>(std::min(step, end - at)),
                      POSIX_FADV_WILLNEED);
  } catch (const SourceError&) {
    // the read that follows reports it
  }
}

uint64_t File::read_gap_bytes() const {
  return is_remote() ? kRemoteReadGap : 0;
}

void File::expect(Expectation expectation) const {
  const auto check_now = [&] {
    check_expectation(expectation, path_.string(),
                      [this](uint64_t at, std::span<std::byte> dst) { read_exact(at, dst); });
  };
  std::visit(Overloaded{
                 [&](const OnDisk&) { check_now(); },
                 [&](const Decoded&) { check_now(); },
                 [&](const Remote& remote) { remote.reader->expect(std::move(expectation)); },
             },
             origin_);
}

std::vector<Expectation> File::expectations() const {
  return std::visit(Overloaded{
                        [](const OnDisk&) { return std::vector<Expectation>{}; },
                        [](const Decoded&) { return std::vector<Expectation>{}; },
                        [](const Remote& remote) { return remote.reader->expectations(); },
                    },
                    origin_);
}

bool File::unchanged() const {
  return std::visit(Overloaded{
                        [&](const OnDisk&) { return on_disk_state() == DiskState::same; },
                        [](const Decoded& decoded) { return decoded.item->backing()->unchanged(); },
                        // the listing taken at the mount is trusted; every read is pinned to its ETag
                        [](const Remote&) { return true; },
                    },
                    origin_);
}

bool File::unchanged_within(std::chrono::nanoseconds interval) const {
  return std::visit(
      Overloaded{
          [&](const OnDisk&) { return on_disk_unchanged_within(interval); },
          [&](const Decoded& decoded) { return decoded.item->backing()->unchanged_within(interval); },
          [](const Remote&) { return true; },
      },
      origin_);
}

bool File::on_disk_unchanged_within(std::chrono::nanoseconds interval) const {
  if (changed_.load(std::memory_order_relaxed)) return false;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  const int64_t checked = checked_at_ns_.load(std::memory_order_relaxed);
  if (checked != INT64_MIN && now - checked < interval.count()) return true;
  switch (on_disk_state()) {
    case DiskState::same:
      break;
    case DiskState::changed:
      changed_.store(true, std::memory_order_relaxed);
      return false;
    case DiskState::unreadable:
      return false;  // not for good: a failed stat (ESTALE, EIO) may pass next time
  }
  checked_at_ns_.store(now, std::memory_order_relaxed);
  return true;
}

File::DiskState File::on_disk_state() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return DiskState::unreadable;
  return identity_of(st) == identity_ ? DiskState::same : DiskState::changed;
}

FileRange::FileRange(FilePtr file) : file_(std::move(file)), base_(0), length_(file_->size()) {}

FileRange::FileRange(FilePtr file, uint64_t base, uint64_t length)
    : file_(std::move(file)), base_(base), length_(length) {
  if (base > file_->size() || length > file_->size() - base)
    throw SourceError(fmt::format("{}: bytes [{}, {}) lie outside the file ({} bytes)",
                                  file_->path().string(), base, base + length, file_->size()));
}

std::vector<std::byte> FileRange::read(uint64_t offset, uint64_t length) const {
  if (offset > length_ || length > length_ - offset)
    throw SourceError(fmt::format("{}: read of {} bytes at offset {} runs past the end of the {} bytes at {}",
                                  file_->path().string(), length, offset, length_, base_));
  return file_->read(base_ + offset, length);
}

void FileRange::prefetch(uint64_t offset, uint64_t length) const {
  if (offset < length_) file_->prefetch(base_ + offset, std::min(length, length_ - offset));
}

uint64_t raise_open_file_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);  // best effort: the fd cache keeps us below any limit anyway
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
}

FilePtr FileSet::open(const std::filesystem::path& path) {
  std::error_code ec;
  auto key = remote_tree::is_s3_path(path) ? path : std::filesystem::weakly_canonical(path, ec);
  if (ec) key = path;
  {
    std::lock_guard lock(mutex_);
    if (auto it = files_.find(key); it != files_.end()) return it->second;
  }
  auto file = source_.open(path);
  std::lock_guard lock(mutex_);
  return files_.try_emplace(key, std::move(file)).first->second;  // a racing open of the path may have won
}

}  // namespace ckptfs::io
