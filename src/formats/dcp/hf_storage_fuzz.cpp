// libFuzzer target: the input as the one shard of a HuggingFaceStorageWriter dir (a safetensors header with
// DCP_SHARDING_INFO), opened, merged and its small tensors read.
#include <cstddef>
#include <cstdint>

#include "catalog/fuzz_reads.hpp"
#include "ckptfs/error.hpp"
#include "formats/dcp/hf_storage.hpp"
#include "io/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ckptfs::io::FuzzInput input(data, size);
  const auto shard = input.link_as("shard-00001-model-00001-of-00001.safetensors");
  try {
    const auto cp = ckptfs::dcp::open_hf_storage(input.source(), shard.parent_path(), {});
    ckptfs::catalog::read_small_tensors(*cp.tags.at(0).catalog(ckptfs::ViewRole::model));
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
