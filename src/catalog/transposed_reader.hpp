// Reads of a transposed tensor (catalog::Transposed, Hugging Face GPT-2's Conv1D weights) through
// tiles of it built with few large source reads and shared by all server threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::catalog {

// Writes elements [first, first + count) of the transposed `tensor` into `out`.
void read_transposed(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                     std::span<std::byte> out);

// Appends the source runs that elements [first, first + count) of the transposed `tensor` are read from
// (the source columns they are, in every source row they touch); dst_begin is the source's element index.
void append_transposed_runs(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                            std::vector<Piece>& out);

}  // namespace ckptfs::catalog
