// How much the kernel reads ahead per request on the device of a source file: one posix_fadvise
// WILLNEED call starts at most that much (max(bdi ra_pages, io_pages) in force_page_cache_ra), so
// io::File::prefetch advises a larger range in pieces of this size.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace ckptfs::io {

// The devices' sizes a source's files have asked for (one per io::SourceCaches).
class DeviceReadahead {
 public:
  // read_ahead_kb of the device's bdi (/sys/class/bdi/MAJ:MIN/read_ahead_kb: 128 KiB for FUSE and NFS by
  // default, the block queue's setting for a disk) in bytes, looked up once per device; 128 KiB when it
  // cannot be read or is 0.
  uint64_t bytes(dev_t device);

 private:
  std::mutex mutex_;
  std::map<dev_t, uint64_t> known_;
};

}  // namespace ckptfs::io
