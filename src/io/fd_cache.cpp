#include "io/fd_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>

#include "ckptfs/error.hpp"

namespace ckptfs::io {

namespace {

int64_t nanoseconds(const struct timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

OpenFd::~OpenFd() {
  ::close(fd_);
}

FileIdentity identity_of(const struct stat& st) {
  return {st.st_dev,
          st.st_ino,
          static_cast<uint64_t>(st.st_size),
          nanoseconds(st.st_mtim),
          nanoseconds(st.st_ctim),
          {},
          {}};
}

OpenedSource open_source(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SourceError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  auto holder = std::make_shared<const OpenFd>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw SourceError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw SourceError(fmt::format("{}: not a regular file", path.string()));
  return {std::move(holder), identity_of(st), Access{st.st_uid, st.st_gid, st.st_mode & 07777}};
}

size_t default_max_open_files() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur < 2) return 256;
  return static_cast<size_t>(std::min<rlim_t>(limit.rlim_cur / 2, kMostOpenSources));
}

// Called with the mutex held. A slot read since the clock last passed it gets a second chance (once per
// pass, so readers cannot keep the loop going); evicted descriptors close once no read holds them.
void DescriptorCache::evict_beyond_capacity() {
  for (size_t spared = 0; ring_.size() > capacity_;) {
    DescriptorSlot* slot = ring_.back();
    if (spared < ring_.size() && slot->used.exchange(false, std::memory_order_relaxed)) {
      ring_.splice(ring_.begin(), ring_, slot->position);
      ++spared;
      continue;
    }
    ring_.pop_back();
    slot->set(nullptr);
  }
}

size_t DescriptorCache::open_count() {
  std::lock_guard lock(mutex_);
  return ring_.size();
}

OpenFdPtr DescriptorCache::insert(DescriptorSlot& slot, OpenFdPtr fd) {
  std::lock_guard lock(mutex_);
  if (OpenFdPtr open = slot.get()) return open;  // reopened meanwhile
  if (!kernel_readahead_) ::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_RANDOM);
  slot.set(fd);
  ring_.push_front(&slot);
  slot.position = ring_.begin();
  evict_beyond_capacity();
  return fd;
}

OpenFdPtr DescriptorCache::acquire(const File& file, DescriptorSlot& slot) {
  if (OpenFdPtr fd = slot.get()) {
    if (!slot.used.load(std::memory_order_relaxed)) slot.used.store(true, std::memory_order_relaxed);
    return fd;
  }
  // Reopen without the lock held (opens on network filesystems take milliseconds).
  OpenedSource opened = open_source(file.path());
  if (opened.identity != file.identity())
    throw SourceError(
        fmt::format("{}: changed since it was indexed (replaced, or its size, mtime or ctime "
                    "differ); remount to serve the new checkpoint",
                    file.path().string()));
  return insert(slot, std::move(opened.fd));
}

void DescriptorCache::forget(DescriptorSlot& slot) {
  std::lock_guard lock(mutex_);
  if (!slot.get()) return;
  ring_.erase(slot.position);
  slot.set(nullptr);
}

}  // namespace ckptfs::io
