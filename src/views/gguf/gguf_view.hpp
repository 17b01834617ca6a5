// The gguf/ view (docs/formats/gguf.md): one file per output type llama.cpp's converter offers (f32, f16,
// bf16, q8_0), each byte for byte what Debian's convert_hf_to_gguf.py writes for the model's Hugging Face
// directory named `hf` (or as -o gguf_name says), computed per read.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/sharding.hpp"
#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

struct GgufViews {
  std::vector<NamedFile> files;  // names inside gguf/
  std::string refusal;           // why there are none
};

struct GgufChoices {
  std::optional<std::string> pre;  // tokenizer.ggml.pre forced (-o gguf_pre=NAME); unset, found as the
                                   // converter finds it (pre_tokenizer.hpp)
  std::string directory = "hf";    // the name of the directory the converter is given (-o gguf_name=NAME)
  std::shared_ptr<catalog::TransposeCache> transpose_cache;  // GgufOptions::transpose_cache
};

// The gguf/ files of the model whose tensors `hf` holds under Hugging Face names, saved as `shards` (tensor
// indices per safetensors file, the files in name order), with `dir` its config.json and tokenizer files.
GgufViews make_gguf_views(const std::shared_ptr<const catalog::Catalog>& hf,
                          const std::vector<std::vector<size_t>>& shards, const HfDirectory& dir,
                          const GgufChoices& choices);

}  // namespace ckptfs::views::gguf
