// The bounded cache of open source descriptors behind io::File (one per io::Runtime, shared by the files of
// its sources: io/source_caches.hpp). Each File keeps its
// descriptor in a slot of its own that reads copy under the slot's own mutex, held for that copy only
// (never across I/O, never shared between files); the cache's lock and its ring of open
// slots are only touched when a descriptor is opened (or reopened after an eviction) and when one is
// evicted: clock order (second chance), the slots read since the cache last looked are spared.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <utility>

#include "ckptfs/io.hpp"

namespace ckptfs::io {

FileIdentity identity_of(const struct stat& st);

// A source file opened read-only: its descriptor, identity and who may read it.
struct OpenedSource {
  OpenFdPtr fd;
  FileIdentity identity;
  Access access;
};
// Opens `path` read-only. Throws SourceError naming the path.
OpenedSource open_source(const std::filesystem::path& path);

// Where a File keeps its descriptor. `fd` is read under `mutex` and set only under the cache's lock as
// well (taken first), so it is set exactly while the slot is in the cache's ring. Not std::atomic<
// shared_ptr>: libstdc++ 12's load releases its spin bit relaxed, which orders nothing on weak memory
// (and ThreadSanitizer reports it).
struct DescriptorSlot {
  std::mutex mutex;
  OpenFdPtr fd;                                   // null: not open (evicted, or never opened)
  std::atomic<bool> used{false};                  // read since the eviction clock last passed it
  std::list<DescriptorSlot*>::iterator position;  // in the ring while fd is set; under the cache's lock

  OpenFdPtr get() {
    std::lock_guard lock(mutex);
    return fd;
  }
  void set(OpenFdPtr to) {
    std::lock_guard lock(mutex);
    fd = std::move(to);
  }
};

// Most descriptors a cache keeps open by default: half the open-file limit (the other half is for FUSE,
// splice pipes and readers), at most kMostOpenSources; 256 when the limit is below 2.
inline constexpr size_t kMostOpenSources = 65536;
size_t default_max_open_files();

class DescriptorCache {
 public:
  // At most `max_open` descriptors (at least 1) open at once, bar those a read in progress holds. Without
  // `kernel_readahead` each is opened with FADV_RANDOM: the mount's own prefetch asks for exactly the
  // ranges a view needs, where the kernel, seeing each shard read in order, reads on past them into bytes
  // no view of the read needs (a 256-rank ZeRO-3 fp32 view, 1.07 GB of masters, pulled 3.05 GB from disk).
  DescriptorCache(size_t max_open, bool kernel_readahead)
      : capacity_(std::max<size_t>(max_open, 1)), kernel_readahead_(kernel_readahead) {}
  DescriptorCache(const DescriptorCache&) = delete;
  DescriptorCache& operator=(const DescriptorCache&) = delete;

  // Hands `fd` (just opened by File::open) to the cache as the slot's descriptor; returns the descriptor
  // the slot holds after (another thread's, when it reopened the same file first).
  OpenFdPtr insert(DescriptorSlot& slot, OpenFdPtr fd);
  // The descriptor of `file`, reopened (and checked against its identity) when it was evicted.
  OpenFdPtr acquire(const File& file, DescriptorSlot& slot);
  // Drops the descriptor of a File being destroyed.
  void forget(DescriptorSlot& slot);
  // Descriptors held now (for tests).
  size_t open_count();

 private:
  void evict_beyond_capacity();

  std::mutex mutex_;
  const size_t capacity_;
  const bool kernel_readahead_;
  std::list<DescriptorSlot*> ring_;  // new and spared slots enter at the front, eviction looks at the back
};

}  // namespace ckptfs::io
