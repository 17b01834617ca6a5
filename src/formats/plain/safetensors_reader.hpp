// The tensors of a .safetensors file, read from its header only (checked as the reference reader does:
// header length, JSON object, dtype names, shapes, data offsets that tile the data section).
#pragma once

#include <string>
#include <vector>

#include "ckptfs/io.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::plain {

struct SafetensorsEntry {
  std::string name;
  torch::SourceTensor tensor;
};

// In file order (by data offset). Throws FormatError naming the file.
std::vector<SafetensorsEntry> read_safetensors(const io::FilePtr& file);

}  // namespace ckptfs::plain
