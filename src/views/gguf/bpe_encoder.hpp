// Byte-level BPE (tokenizers' BPE model behind a ByteLevel pre-tokenizer) for a fixed set of words: the
// converter's check text, pre-tokenized. Only the merges that can apply inside these words are ranked, so
// that a vocabulary of 150k merges costs one pass over them and no map of its own.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckptfs::views::gguf {

class BpeEncoder {
 public:
  // `model`: tokenizer.json's BPE model (vocab, merges); `words`: the byte strings encode() will be given.
  // Throws Refusal for merges in an unknown format.
  BpeEncoder(const nlohmann::json& model, bool ignore_merges, const std::vector<std::string>& words);

  // Appends the ids of one word (a pre-token, as bytes). Throws Refusal where a symbol is not in the
  // vocabulary.
  void encode(const std::string& word, std::vector<int64_t>& ids) const;

 private:
  int64_t id_of(const std::string& symbol) const;

  const nlohmann::json& vocab_;
  bool ignore_merges_;
  std::unordered_map<std::string, size_t> ranks_;  // "left right" -> rank, for merges inside the words only
};

}  // namespace ckptfs::views::gguf
