#include "io/fd_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "ckptfs/error.hpp"

namespace ckptfs::io {

namespace {

int64_t nanoseconds(const struct timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// LRU: the front of `order` is the most recently used file.
struct Cache {
  std::mutex mutex;
  size_t capacity = 256;
  bool kernel_readahead = true;
  std::list<const File*> order;
  struct Entry {
    OpenFdPtr fd;
    std::list<const File*>::iterator position;
  };
  std::unordered_map<const File*, Entry> entries;

  void advise(const OpenFd& fd) const {
    ::posix_fadvise(fd.get(), 0, 0, kernel_readahead ? POSIX_FADV_NORMAL : POSIX_FADV_RANDOM);
  }

  // Called with the mutex held. Evicted descriptors close once no read holds them.
  void evict_beyond_capacity() {
    while (entries.size() > capacity && !order.empty()) {
      entries.erase(order.back());
      order.pop_back();
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
          nanoseconds(st.st_ctim)};
}

std::pair<OpenFdPtr, FileIdentity> open_source(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SourceError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  auto holder = std::make_shared<const OpenFd>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw SourceError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw SourceError(fmt::format("{}: not a regular file", path.string()));
  return {std::move(holder), identity_of(st)};
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
  for (const auto& [file, entry] : c.entries) c.advise(*entry.fd);
}

size_t open_file_count() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.entries.size();
}

namespace fd_cache {

void insert(const File* file, OpenFdPtr fd) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.entries.find(file);
  if (it != c.entries.end()) {
    c.order.splice(c.order.begin(), c.order, it->second.position);
    return;
  }
  if (!c.kernel_readahead) c.advise(*fd);
  c.order.push_front(file);
  c.entries.emplace(file, Cache::Entry{std::move(fd), c.order.begin()});
  c.evict_beyond_capacity();
}

OpenFdPtr acquire(const File& file) {
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    auto it = c.entries.find(&file);
    if (it != c.entries.end()) {
      c.order.splice(c.order.begin(), c.order, it->second.position);
      return it->second.fd;
    }
  }
  // Reopen without the lock held (opens on network filesystems take milliseconds).
  auto [fd, identity] = open_source(file.path());
  if (identity != file.identity())
    throw SourceError(fmt::format("{}: changed since it was indexed (replaced, or its size, mtime or ctime "
                                  "differ); remount to serve the new checkpoint",
                                  file.path().string()));
  insert(&file, fd);
  return fd;
}

void forget(const File* file) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.entries.find(file);
  if (it == c.entries.end()) return;
  c.order.erase(it->second.position);
  c.entries.erase(it);
}

}  // namespace fd_cache

}  // namespace ckptfs::io
