// The caches the files of a source read through, which belong to the io::Runtime that opened the source
// (Runtime::open_local, open_remote): the source hands them to each File it opens (io::Source::open) and the
// File keeps them, as it does the block cache of an object, from the source's listing (io/remote_tree.hpp).
#pragma once

#include <cstdint>

#include "io/decoded_cache.hpp"
#include "io/fd_cache.hpp"
#include "io/readahead_size.hpp"

namespace ckptfs::io {

struct SourceCaches {
  SourceCaches(size_t max_open_files, bool kernel_readahead, uint64_t decoded_bytes)
      : descriptors(max_open_files, kernel_readahead), decoded(decoded_bytes) {}
  DescriptorCache descriptors;
  DecodedCache decoded;
  DeviceReadahead readahead;  // the pieces File::prefetch advises on each device
};

}  // namespace ckptfs::io
