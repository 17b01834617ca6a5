// The gguf/ view (docs/formats/gguf.md): one file per output type llama.cpp's converter offers (f32, f16,
// bf16, q8_0), each byte for byte what Debian's convert_hf_to_gguf.py writes for the model's Hugging Face
// directory named `hf`, computed per read.
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

// The gguf/ files of the model whose tensors `hf` holds under Hugging Face names (in one shard), with
// `dir` its config.json and tokenizer files. `pre` forces tokenizer.ggml.pre (-o gguf_pre=NAME); unset, it
// is found as the converter finds it (pre_tokenizer.hpp).
GgufViews make_gguf_views(const std::shared_ptr<const catalog::Catalog>& hf, const HfDirectory& dir,
                          const std::optional<std::string>& pre);

}  // namespace ckptfs::views::gguf
