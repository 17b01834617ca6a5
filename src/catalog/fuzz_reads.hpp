// For the fuzz targets (src/**/*_fuzz.cpp): every small tensor of a catalog read in full, so that a parsed
// layout is also served, not only accepted.
#pragma once

#include <cstddef>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::catalog {

inline void read_small_tensors(const Catalog& catalog, size_t max_bytes = size_t{1} << 16) {
  std::vector<std::byte> out;
  for (const auto& t : catalog.tensors) {
    if (t.nbytes() > max_bytes) continue;
    out.resize(t.nbytes());
    read_tensor(t, 0, out);
  }
}

}  // namespace ckptfs::catalog
