// libFuzzer target: the index decoder on arbitrary bytes (seeds: indexes of the real fixtures, so their
// source files exist), then the small tensors of every decoded catalog read from those sources.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "catalog/fuzz_reads.hpp"
#include "ckptfs/error.hpp"
#include "index/checkpoint_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto cp = ckptfs::index::decode_checkpoint(std::string_view(reinterpret_cast<const char*>(data), size));
    for (const auto& tag : cp.tags)
      for (const auto& [role, catalog] : tag.catalogs) ckptfs::catalog::read_small_tensors(*catalog);
  } catch (const ckptfs::Error&) {
  } catch (const ckptfs::index::StaleIndex&) {
  }
  return 0;
}
