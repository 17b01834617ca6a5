// Reads of a transposed tensor (catalog::Transposed, Hugging Face GPT-2's Conv1D weights) through
// tiles of it built with few large source reads and shared by all threads reading through its
// TransposeCache (Transposed::tiles).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::catalog {

// Writes elements [first, first + count) of the transposed `tensor` into `out`; with `deferred`, the parts
// of kMinHeldRun bytes or more are left to it as bytes of the tiles they are in (see read_tensor).
void read_transposed(const LogicalTensor& tensor, const Transposed& source, uint64_t first, uint64_t count,
                     std::span<std::byte> out, std::vector<DeferredRun>* deferred = nullptr);

// Has the first tile whose first element is in [first, first + count) of the transposed `tensor` built
// in the background, unless the cache has no room for it without evicting a tile not yet read to its end
// (for prefetch: a reader reaching the tensor then finds it built).
void build_transposed_ahead(const LogicalTensor& tensor, const Transposed& source, uint64_t first,
                            uint64_t count);

// Appends the source runs that a front-to-back read of elements [first, first + count) of the transposed
// `tensor` newly reads, for prefetch: the source block (every source row's segment) of each tile that
// starts in the range, as a tile is built whole; nothing when none starts there. dst_begin is the
// source's element index.
void append_transposed_runs(const LogicalTensor& tensor, const Transposed& source, uint64_t first,
                            uint64_t count, std::vector<Piece>& out);

}  // namespace ckptfs::catalog
