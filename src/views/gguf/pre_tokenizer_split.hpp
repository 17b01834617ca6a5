// The regex splits of the byte-level BPE pre-tokenizers the converter knows, written out over Unicode's
// categories (tokenizers runs them with Oniguruma; RE2 has no lookahead). Only the converter's check text is
// ever split, so the categories are those of its characters (and of the space a prefix adds).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::views::gguf {

enum class SplitRegex {
  gpt2,  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (ByteLevel's use_regex)
  llama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
           // \s*[\r\n]+|\s+(?!\S)|\s+
  qwen2,   // Llama 3's with \p{N} for \p{N}{1,3}: one digit a piece
};

// The regex of a tokenizer.json Split pattern, nullopt for one not written out here.
std::optional<SplitRegex> split_regex_of(std::string_view pattern);

// The pieces of `text` (behavior Isolated: every match is a piece; these regexes leave no gaps). Throws
// Refusal for a character outside the check text's.
std::vector<std::string> split_text(std::string_view text, SplitRegex regex);

}  // namespace ckptfs::views::gguf
