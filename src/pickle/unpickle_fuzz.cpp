// libFuzzer target: the unpickler on arbitrary bytes must return a value or throw ckptfs::Error, never
// crash, hang or run out of memory (bounded depth, memo and expansion).
#include <cstddef>
#include <cstdint>
#include <span>

#include "ckptfs/error.hpp"
#include "ckptfs/pickle.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckptfs::pickle::unpickle(std::as_bytes(std::span(data, size)));
  } catch (const ckptfs::Error&) {
  }
  return 0;
}
