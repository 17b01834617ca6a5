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

// In file order (by data offset). Throws FormatError naming the file.
std::vector<SafetensorsEntry> read_safetensors(const io::FilePtr& file);

// A safetensors blob that starts `range.base()` bytes into a file and runs to its end (DCP's
// serialization_format=SAFETENSORS appends one to each data file): its tensors (storage offsets in the
// file) and its __metadata__ strings.
struct SafetensorsBlob {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};
SafetensorsBlob read_safetensors_blob(const io::FileRange& range);

}  // namespace ckptfs::plain
