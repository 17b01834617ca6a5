// The caches the files of a source read through, which belong to the io::Runtime that opened the source
// (Runtime::add_source): File::open finds them by the file's path and the File keeps them, as the block
// cache of an object reaches its File through the source's listing (io/remote_tree.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

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

// Files at or below `root` read through `caches` while those live (the Runtime holds them).
void register_source(const std::filesystem::path& root, const std::shared_ptr<SourceCaches>& caches);
// The caches of the deepest registered source holding `path`; a file below none (a unit test's, a
// -o config= file beside the checkpoint) gets caches of its own, which keep its descriptor open.
std::shared_ptr<SourceCaches> caches_for(const std::filesystem::path& path);

}  // namespace ckptfs::io
