// A Checkpoint (everything indexing parsed from a source: catalogs, universal plans, state values, side
// files) encoded as bytes, with what it was parsed from: the identity of every source file it reads
// and of the files and directories that decide its tags. Decoding reopens the files and checks them.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "ckptfs/checkpoint.hpp"
#include "index/checkpoint_fields.hpp"

namespace ckptfs::index {

// Throws UnsupportedError when the checkpoint holds something the index cannot encode (then no index is
// written and mounts parse as before). `source` is the one the checkpoint was opened from.
std::string encode_checkpoint(const io::Source& source, const Checkpoint& checkpoint);

// The decoder's one entry point (also the fuzz target's): any bytes at all give a Checkpoint, or
// FormatError when they are damaged, or StaleIndex (a FormatError) when a source is no longer what was
// indexed; never another exception, never a crash. Its files are reopened from `source` (the loading
// command's), its transposed tensors keep their tiles in `transpose_cache` (the loading command's; by
// default one of their own).
Checkpoint decode_checkpoint(
    std::span<const std::byte> data, io::SourcePtr source,
    std::shared_ptr<catalog::TransposeCache> transpose_cache = catalog::make_transpose_cache());

}  // namespace ckptfs::index
