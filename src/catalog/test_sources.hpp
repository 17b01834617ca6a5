// Test helpers for catalog and view tests: source files with given bytes, and conversions written
// independently of the library (integer bit manipulation only) to check it against.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/io.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::testing {

// A temporary source file holding `bytes`, opened as an io::File and removed at scope exit.
class SourceFile {
 public:
  explicit SourceFile(std::span<const std::byte> bytes) : bytes_(bytes.begin(), bytes.end()) {
    char name[] = "/tmp/ckptfs_source_XXXXXX";
    const int fd = ::mkstemp(name);
    path_ = name;
    for (size_t done = 0; done < bytes.size();)
      done += static_cast<size_t>(::write(fd, bytes.data() + done, bytes.size() - done));
    ::close(fd);
    file_ = io::File::open_standalone(path_);
  }
  template <typename T>
  static SourceFile of(const std::vector<T>& values) {
    return SourceFile(std::as_bytes(std::span(values)));
  }
  ~SourceFile() { ::unlink(path_.c_str()); }
  SourceFile(const SourceFile&) = delete;

  const io::FilePtr& file() const { return file_; }
  const std::vector<std::byte>& bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::vector<std::byte> bytes_;
  std::string path_;
  io::FilePtr file_;
};

// 1-D F32 tensor over elements [first, first + count) of a float source file (a view of its storage).
inline torch::SourceTensor float_slice(const SourceFile& file, uint64_t first, uint64_t count) {
  torch::SourceTensor t;
  t.storage = {file.file(), 0, file.file()->size()};
  t.dtype = DType::F32;
  t.shape = {static_cast<int64_t>(count)};
  t.strides = {1};
  t.storage_offset = static_cast<int64_t>(first);
  return t;
}

// /proc/self/io's syscr: the read system calls (read, pread) this process has made; 0 without it.
// A counter of this process's /proc/self/io ("syscr:" read calls, "rchar:" bytes read).
inline uint64_t io_counter(const std::string& name) {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value)
    if (key == name) return value;
  return 0;
}
inline uint64_t read_syscalls() {
  return io_counter("syscr:");
}
inline uint64_t bytes_read() {
  return io_counter("rchar:");
}

namespace reference {

inline uint32_t f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return sign | 0x7F800000u | (man ? 0x400000u | (man << 13) : 0);  // NaN made quiet
  if (exp != 0) return sign | ((exp + 112) << 23) | (man << 13);
  if (man == 0) return sign;
  uint32_t e = 113, m = man;  // subnormal: normalise
  while (!(m & 0x400)) {
    m <<= 1;
    --e;
  }
  return sign | (e << 23) | ((m & 0x3FF) << 13);
}

inline uint32_t bf16_to_f32(uint16_t b) {
  return static_cast<uint32_t>(b) << 16;
}

// Drops `shift` low bits of m, rounding to nearest, ties to even.
inline uint64_t round_shift(uint64_t m, unsigned shift) {
  if (shift == 0) return m;
  if (shift > 40) return 0;
  const uint64_t q = m >> shift, r = m & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
  return q + ((r > half || (r == half && (q & 1))) ? 1 : 0);
}

inline uint16_t f32_to_f16(uint32_t w) {
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000);
  const int exp = static_cast<int>((w >> 23) & 0xFF);
  const uint32_t man = w & 0x7FFFFF;
  if (exp == 0xFF) return sign | (man ? 0x7E00 : 0x7C00);
  if (exp == 0) return sign;     // f32 subnormals are far below half of f16's smallest subnormal
  const int e = exp - 127 + 15;  // f16 biased exponent
  const uint64_t m = man | 0x800000u;
  if (e >= 1) {
    const uint64_t bits = (static_cast<uint64_t>(e) << 10) + round_shift(m, 13) - 0x400;
    return sign | static_cast<uint16_t>(bits >= 0x7C00 ? 0x7C00 : bits);
  }
  return sign | static_cast<uint16_t>(round_shift(m, static_cast<unsigned>(13 + 1 - e)));
}

inline uint16_t f32_to_bf16(uint32_t w) {
  if ((w & 0x7F800000u) == 0x7F800000u && (w & 0x7FFFFF)) return 0xFFFF;
  return static_cast<uint16_t>(round_shift(w, 16));
}

}  // namespace reference
}  // namespace ckptfs::testing
