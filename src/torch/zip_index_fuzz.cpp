// libFuzzer target: the zip directory reader (end records, zip64, central directory, local headers).
#include <cstddef>
#include <cstdint>

#include "ckptfs/error.hpp"
#include "io/fuzz_input.hpp"
#include "torch/zip_index.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ckptfs::io::FuzzInput input(data, size);
  try {
    const ckptfs::io::FileRange file(input.open());
    const auto index = ckptfs::torch::ZipIndex::read(file);
    for (const char* name : {"data.pkl", "data/0", "data/1", "version", "byteorder"})
      if (const auto* entry = index.find(name)) index.locate(file, *entry);
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
