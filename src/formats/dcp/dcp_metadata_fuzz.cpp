// libFuzzer target: a DCP .metadata pickle read into items, chunks and storage locations.
#include <cstddef>
#include <cstdint>

#include "ckptfs/error.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "io/fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ckptfs::io::FuzzInput input(data, size);
  try {
    ckptfs::dcp::read_metadata(input.source(), input.path());
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
