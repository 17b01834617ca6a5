// Checking the bytes a parse took on trust (io::Expectation), for every kind of file.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>

#include "ckptfs/io.hpp"

namespace ckptfs::io {

// [first byte, end) of the pieces of `expected` (a local header and its name lie together).
std::pair<uint64_t, uint64_t> pieces_span(const Expectation& expected);

// Reads the pieces of `expected` with `read` (one call, from the first piece to the end of the last) and
// throws SourceError naming `where` and what the bytes were taken to be when one differs.
void check_expectation(const Expectation& expected, std::string_view where,
                       const std::function<void(uint64_t offset, std::span<std::byte> dst)>& read);

}  // namespace ckptfs::io
