// What the tokenizer that transformers 5's AutoTokenizer builds from a model's files does to a text, as far
// as its ids go: read from tokenizer.json and tokenizer_config.json for the tokenizer classes ckptfs follows,
// and refused (naming the part) wherever it takes a step ckptfs does not encode.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "views/gguf/pre_tokenizer_split.hpp"

namespace ckptfs::views::gguf {

// The class AutoTokenizer loads (chosen from config.json's model_type and tokenizer_config.json's
// tokenizer_class).
enum class TokenizerClass {
  backend,  // TokenizersBackend (PreTrainedTokenizerFast): tokenizer.json as it is
  qwen2,    // Qwen2Tokenizer: the file's vocabulary and merges inside Qwen2's own normalizer (NFC) and Split
};

struct ByteLevelStep {
  bool add_prefix_space;  // a space before every piece that does not start with one
  bool use_regex;         // GPT-2's split of every piece
};

struct TokenizerPipeline {
  std::vector<SplitRegex> splits;      // Split pre-tokenizers (behavior Isolated), in order
  ByteLevelStep byte_level;            // the last pre-tokenizer
  bool ignore_merges = false;          // the BPE model's: a piece that is a token is not merged
  std::vector<int64_t> before, after;  // the post-processor's special tokens around the text's ids
};

// The pipeline that encodes `text` (normalizers: none or NFC, which must leave `text` as it is). Throws
// Refusal for a part not encoded, or for an added or special token that occurs in `text`.
TokenizerPipeline read_pipeline(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                                TokenizerClass tokenizer_class, std::string_view text);

}  // namespace ckptfs::views::gguf
