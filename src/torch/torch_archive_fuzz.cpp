// libFuzzer target: a whole torch.save file (zip or legacy), its pickle and every tensor's bounds.
#include <cstddef>
#include <cstdint>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "io/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ckptfs::io::FuzzInput input(data, size);
  try {
    ckptfs::torch::TorchArchive::open(input.open());
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
