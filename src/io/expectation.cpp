#include "io/expectation.hpp"

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "ckptfs/error.hpp"

namespace ckptfs::io {

void check_expectation(const Expectation& expected, std::string_view where,
                       const std::function<void(uint64_t offset, std::span<std::byte> dst)>& read) {
  std::vector<std::byte> bytes;
  for (const auto& [offset, want] : expected.pieces) {
    bytes.resize(want.size());
    read(offset, bytes);
    if (std::memcmp(bytes.data(), want.data(), want.size()) != 0)
      throw SourceError(fmt::format("{}: {}: the {} bytes at offset {} are not what the parse took them to be "
                                    "(not written as the format's own writer writes it); bytes [{}, {}) are not "
                                    "served",
                                    where, expected.what, want.size(), offset, expected.guard_begin,
                                    expected.guard_end));
  }
}

}  // namespace ckptfs::io
