// The legacy (pre-1.6, _use_new_zipfile_serialization=False) torch.save format: magic number, protocol
// version and sys_info pickles, the object pickle, the sorted storage key list, then each storage as a
// u64 element count and its raw bytes. No index exists, so storage offsets come from walking the counts.
#pragma once

#include "ckptfs/io.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::torch {

// True when the file starts with the legacy magic number pickle.
bool is_legacy_file(const io::File& file);

// The unpickled object with every tensor's storage span resolved. Throws FormatError (without the file
// name) when the file is malformed.
pickle::ValuePtr read_legacy(const io::FilePtr& file);

}  // namespace ckptfs::torch
