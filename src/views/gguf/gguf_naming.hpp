// What llama.cpp's converter makes of the model directory's name and the tensors' sizes: general.name,
// basename, finetune, version and size_label (gguf-py metadata.py's heuristics, utility.py's size_label) and
// the file name (utility.py's naming_convention), for a directory without README.md or _name_or_path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "views/gguf/gguf_kv.hpp"

namespace ckptfs::views::gguf {

// The parameter counts gguf-py's GGUFWriter.get_total_parameter_count takes from the tensor infos.
struct ParameterCount {
  uint64_t total = 0;
  uint64_t shared = 0;        // tensors without "_exps." (and 2-D ones with it)
  uint64_t expert = 0;        // per expert: each 3-D "_exps." tensor's size over its expert count
  uint64_t expert_count = 0;  // the mean expert count of those tensors; 0 for a dense model
};

struct ModelNaming {
  std::string name;  // general.name
  std::optional<std::string> basename, finetune, version, size_label;
};

// Whether `directory` is a name the naming heuristics are followed for: ASCII letters, digits, '.', '_' and
// '-', some letter or digit, not starting with '.'.
bool valid_directory_name(std::string_view directory);

// The naming of a model of `count` parameters converted from a directory named `directory`
// (valid_directory_name): the size label parsed from the name where it has one, else the count's.
ModelNaming name_model(std::string_view directory, const ParameterCount& count);

// Metadata.set_gguf_meta_model's name keys, in its order (no sampling keys: the caller refuses those).
void add_naming(KvList& kv, const ModelNaming& naming);

// naming_convention(...) + ".gguf" for output type `outtype` ("F32", "BF16", "Q8_0").
std::string gguf_file_name(const ModelNaming& naming, std::string_view outtype);

}  // namespace ckptfs::views::gguf
