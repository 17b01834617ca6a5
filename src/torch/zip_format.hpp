// The zip torch.save format (torch >= 1.6): data.pkl unpickled, storages in records data/<key>.
#pragma once

#include "ckptfs/io.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::torch {

// True when the file starts with a zip local header (the only check torch.load makes).
bool is_zip_file(const io::FileRange& file);

// The unpickled data.pkl with every tensor's storage span resolved. Throws FormatError (without the file
// name) when the archive is malformed.
pickle::ValuePtr read_zip(const io::FileRange& file);

}  // namespace ckptfs::torch
