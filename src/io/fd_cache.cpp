#include "io/fd_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
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

// The ring of open slots: new and spared ones enter at the front, eviction looks at the back.
struct Cache {
  std::mutex mutex;
  size_t capacity = 256;
  bool kernel_readahead = true;
  std::list<DescriptorSlot*> ring;

  void advise(const OpenFd& fd) const {
    ::posix_fadvise(fd.get(), 0, 0, kernel_readahead ? POSIX_FADV_NORMAL : POSIX_FADV_RANDOM);
  }

  // Called with the mutex held. A slot read since the clock last passed it gets a second chance (once
  // per pass, so readers cannot keep the loop going); evicted descriptors close once no read holds them.
  void evict_beyond_capacity() {
    for (size_t spared = 0; ring.size() > capacity;) {
      DescriptorSlot* slot = ring.back();
      if (spared < ring.size() && slot->used.exchange(false, std::memory_order_relaxed)) {
        ring.splice(ring.begin(), ring, slot->position);
        ++spared;
        continue;
      }
      ring.pop_back();
      slot->set(nullptr);
    }
  }
};

Cache& cache() {
  static Cache* instance = new Cache();  // never destroyed: Files may outlive static destruction order
  return *instance;
}

}  // namespace

OpenFd::~OpenFd() {
  ::close(fd_);
}

FileIdentity identity_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size), nanoseconds(st.st_mtim),
          nanoseconds(st.st_ctim), {}, {}};
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

void set_max_open_files(size_t max_open) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.capacity = std::max<size_t>(max_open, 1);
  c.evict_beyond_capacity();
}

size_t max_open_files() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.capacity;
}

void set_kernel_readahead(bool on) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  c.kernel_readahead = on;
  for (DescriptorSlot* slot : c.ring) c.advise(*slot->get());
}

size_t open_file_count() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.ring.size();
}

namespace fd_cache {

OpenFdPtr insert(DescriptorSlot& slot, OpenFdPtr fd) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  if (OpenFdPtr open = slot.get()) return open;  // reopened meanwhile
  if (!c.kernel_readahead) c.advise(*fd);
  slot.set(fd);
  c.ring.push_front(&slot);
  slot.position = c.ring.begin();
  c.evict_beyond_capacity();
  return fd;
}

OpenFdPtr acquire(const File& file, DescriptorSlot& slot) {
  if (OpenFdPtr fd = slot.get()) {
    if (!slot.used.load(std::memory_order_relaxed)) slot.used.store(true, std::memory_order_relaxed);
    return fd;
  }
  // Reopen without the lock held (opens on network filesystems take milliseconds).
  OpenedSource opened = open_source(file.path());
  if (opened.identity != file.identity())
    throw SourceError(fmt::format("{}: changed since it was indexed (replaced, or its size, mtime or ctime "
                                  "differ); remount to serve the new checkpoint",
                                  file.path().string()));
  return insert(slot, std::move(opened.fd));
}

void forget(DescriptorSlot& slot) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  if (!slot.get()) return;
  c.ring.erase(slot.position);
  slot.set(nullptr);
}

}  // namespace fd_cache

}  // namespace ckptfs::io
