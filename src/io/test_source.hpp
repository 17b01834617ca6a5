// For unit tests: local sources read through caches of their own, as a command's Runtime would open them.
#pragma once

#include <filesystem>

#include "ckptfs/io_tree.hpp"
#include "io/runtime.hpp"

namespace ckptfs::io {

// The local source at `root` (a checkpoint a test opens).
inline SourcePtr test_source(const std::filesystem::path& root) {
  return Runtime().open_local(root);
}

}  // namespace ckptfs::io
