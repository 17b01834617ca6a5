// The tokenizer.* keys of a byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json, config.json),
// as the converter's _set_vocab_gpt2 and gguf-py's SpecialVocab write them.
#pragma once

#include <string>

#include "views/gguf/gguf_kv.hpp"
#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

// Adds the keys in the converter's order; `tokenizer` is dir's tokenizer.json, `pre` tokenizer.ggml.pre.
// Throws Refusal where the converter takes another path (SentencePiece, a Llama 2 HF vocabulary) or
// ckptfs does not follow it.
void add_bpe_tokenizer(KvList& kv, const HfDirectory& dir, const nlohmann::json& tokenizer,
                       const nlohmann::json& config, const std::string& pre);

}  // namespace ckptfs::views::gguf
