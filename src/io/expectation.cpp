#include "io/expectation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ckptfs/error.hpp"

namespace ckptfs::io {

std::pair<uint64_t, uint64_t> pieces_span(const Expectation& expected) {
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& [offset, want] : expected.pieces)
    lo = std::min(lo, offset), hi = std::max(hi, offset + want.size());
  return {lo, hi};
}

void check_expectation(const Expectation& expected, std::string_view where,
                       const std::function<void(uint64_t offset, std::span<std::byte> dst)>& read) {
  if (expected.pieces.empty()) return;
  const auto [lo, hi] = pieces_span(expected);
  std::vector<std::byte> bytes(hi - lo);  // one read
  read(lo, bytes);
  for (const auto& [offset, want] : expected.pieces) {
    if (std::memcmp(bytes.data() + (offset - lo), want.data(), want.size()) != 0)
      throw SourceError(
          fmt::format("{}: {}: the {} bytes at offset {} are not what the parse took them to be "
                      "(not written as the format's own writer writes it); bytes [{}, {}) are not "
                      "served",
                      where, expected.what, want.size(), offset, expected.guard_begin, expected.guard_end));
  }
}

}  // namespace ckptfs::io
