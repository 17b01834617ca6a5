// A lone weights file as SRC: a torch.save file (a FULL_STATE_DICT, pytorch_model.bin, a nested
// {'model': ..., 'optimizer': ...} dict) or a .safetensors file.
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::plain {

// True when `root` (as `source` reads it) is a regular file (a torch.save or safetensors file is expected
// there).
bool is_plain_source(const io::Source& source, const std::filesystem::path& root);

// One tag, named after the file: model.safetensors and fp32/ of its model tensors (the same rule as for
// DCP state dicts: the 'model' subtree, or every tensor outside training state).
Checkpoint open(const io::Source& source, const std::filesystem::path& root, const OpenOptions& options);

}  // namespace ckptfs::plain
