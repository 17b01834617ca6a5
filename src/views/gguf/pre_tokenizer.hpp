// tokenizer.ggml.pre as llama.cpp's converter finds it (conversion/base.py get_vocab_base_pre): the ids the
// tokenizer transformers loads gives the converter's fixed check text (with its special tokens), printed as a
// Python list and hashed with SHA-256, looked up in the converter's table of known tokenizers. ckptfs encodes
// the text itself (tokenizer_pipeline: what the tokenizer does; pre_tokenizer_split: the regex splits;
// bpe_encoder: the merges).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "views/gguf/tokenizer_pipeline.hpp"

namespace ckptfs::views::gguf {

// The ids the converter hashes. Throws Refusal where the tokenizer takes a step ckptfs does not encode,
// naming it.
std::vector<int64_t> check_text_ids(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                                    TokenizerClass tokenizer_class);

// The converter's name for the tokenizer's pre-tokenizer. Throws Refusal when its hash is not one the
// converter knows (the converter refuses too), or as check_text_ids does.
std::string identify_pre_tokenizer(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                                   TokenizerClass tokenizer_class);

}  // namespace ckptfs::views::gguf
