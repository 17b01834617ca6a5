// What llama.cpp's converter reads besides the weights: the small files of the model's Hugging Face
// directory (config.json, tokenizer files), by file name, and why it would refuse them.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

namespace ckptfs::views::gguf {

// The converter would refuse the model (or ckptfs cannot yet write what it writes): no gguf/ file, and
// inspect says why.
struct Refusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct HfDirectory {
  std::map<std::string, std::string, std::less<>> files;  // name -> bytes

  bool has(std::string_view name) const { return files.contains(name); }
  // The file parsed as a JSON object; nullopt when absent. Throws Refusal when it is not JSON or not an
  // object (every file the converter reads as JSON holds one).
  std::optional<nlohmann::json> json(std::string_view name) const;
};

}  // namespace ckptfs::views::gguf
