// libFuzzer target: the input as a lone .safetensors file (header length, JSON header, dtypes, shapes, data
// offsets), opened as a checkpoint and its small tensors read as saved and upcast to fp32.
#include <cstddef>
#include <cstdint>

#include "catalog/fuzz_reads.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/plain.hpp"
#include "io/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ckptfs::io::FuzzInput input(data, size);
  try {
    const auto cp = ckptfs::plain::open(input.source(), input.link_as("model.safetensors"), {});
    for (const auto role : {ckptfs::ViewRole::model, ckptfs::ViewRole::fp32})
      ckptfs::catalog::read_small_tensors(*cp.tags.at(0).catalog(role));
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
