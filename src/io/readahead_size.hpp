// How much the kernel reads ahead per request on the device of a source file: one posix_fadvise
// WILLNEED call starts at most that much (max(bdi ra_pages, io_pages) in force_page_cache_ra), so
// io::File::prefetch advises a larger range in pieces of this size.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace ckptfs::io {

// read_ahead_kb of the device's bdi (/sys/class/bdi/MAJ:MIN/read_ahead_kb: 128 KiB for FUSE and NFS by
// default, the block queue's setting for a disk) in bytes, looked up once per device; 128 KiB when it
// cannot be read or is 0.
uint64_t readahead_bytes(dev_t device);

}  // namespace ckptfs::io
