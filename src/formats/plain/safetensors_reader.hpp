// The tensors of a .safetensors file, read from its header only (checked as the reference reader does:
// header length, JSON object, dtype names, shapes, data offsets that tile the data section).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ckptfs/io.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::plain {

struct SafetensorsEntry {
  std::string name;
  torch::SourceTensor tensor;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // in file order (by data offset)
  std::map<std::string, std::string> metadata;  // __metadata__ (string values, as the format requires)
};

// Throws FormatError naming the file.
SafetensorsHeader read_safetensors_header(const io::FilePtr& file);

// The tensors of read_safetensors_header.
std::vector<SafetensorsEntry> read_safetensors(const io::FilePtr& file);

// The header of a safetensors blob that starts `range.base()` bytes into a file and runs to its end (DCP's
// serialization_format=SAFETENSORS appends one to each data file; storage offsets are in the file).
SafetensorsHeader read_safetensors_blob(const io::FileRange& range);

}  // namespace ckptfs::plain
