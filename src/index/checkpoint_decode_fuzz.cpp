// libFuzzer target: the index decoder on arbitrary bytes (seeds: indexes of the real fixtures, so their
// source files exist), then the small tensors of every decoded catalog read from those sources.
#include <cstddef>
#include <cstdint>
#include <span>

#include "catalog/fuzz_reads.hpp"
#include "ckptfs/error.hpp"
#include "index/checkpoint_codec.hpp"
#include "io/runtime.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    static const ckptfs::io::SourcePtr root =
        ckptfs::io::Runtime().open_local("/");  // the seeds' paths are absolute
    const auto cp = ckptfs::index::decode_checkpoint(std::as_bytes(std::span(data, size)), root);
    for (const auto& tag : cp.tags)
      for (const auto& [role, catalog] : tag.named_catalogs()) ckptfs::catalog::read_small_tensors(*catalog);
  } catch (const ckptfs::Error&) {  // FormatError, StaleIndex (a source file changed) among them
  }
  return 0;
}
