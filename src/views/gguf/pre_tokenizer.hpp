// tokenizer.ggml.pre as llama.cpp's converter finds it (conversion/base.py get_vocab_base_pre): the ids a
// tokenizer gives its fixed check text, printed as a Python list and hashed with SHA-256, looked up in the
// converter's table of known tokenizers. ckptfs encodes the text itself: the tokenizer.json's normalizer,
// pre-tokenizer, byte-level BPE and post-processor, for the kinds the known families use.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ckptfs::views::gguf {

// The converter's name for the tokenizer's pre-tokenizer. Throws Refusal when its hash is not one the
// converter knows (the converter refuses too), or when the tokenizer uses a part ckptfs does not encode yet.
std::string identify_pre_tokenizer(const nlohmann::json& tokenizer);

}  // namespace ckptfs::views::gguf
