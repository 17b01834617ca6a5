// A Checkpoint (everything indexing parsed from a source: catalogs, universal plans, state values, side
// files) encoded as bytes, with what it was parsed from: the identity of every source file it reads
// and of the files and directories that decide its tags. Decoding reopens the files and checks them.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::index {

// The sources changed since the index was written (a file replaced, touched, added or removed).
struct StaleIndex : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws UnsupportedError when the checkpoint holds something the index cannot encode (then no index is
// written and mounts parse as before).
std::string encode_checkpoint(const Checkpoint& checkpoint);

// Throws StaleIndex when a source is no longer what was indexed, FormatError when the bytes are damaged.
Checkpoint decode_checkpoint(std::string_view data);

}  // namespace ckptfs::index
