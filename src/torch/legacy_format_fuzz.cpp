// libFuzzer target: the pre-1.6 torch.save format (magic, protocol, sys info pickles, storage blocks).
#include <cstddef>
#include <cstdint>

#include "ckptfs/error.hpp"
#include "io/fuzz_input.hpp"
#include "torch/legacy_format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ckptfs::io::FuzzInput input(data, size);
  try {
    const auto file = input.open();
    if (ckptfs::torch::is_legacy_file(*file)) ckptfs::torch::read_legacy(file);
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
