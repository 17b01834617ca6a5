// The special tokens gguf-py's SpecialVocab writes (vocab.py _try_load_from_tokenizer_json and
// _try_load_from_config_json): their ids, whether the tokenizer adds them, the chat template.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckptfs::views::gguf {

// Keys and values in the order first set (Python dicts).
template <class V>
struct Ordered {
  std::vector<std::pair<std::string, V>> items;
  bool has(const std::string& k) const {
    return std::any_of(items.begin(), items.end(), [&](const auto& i) { return i.first == k; });
  }
  void set_default(const std::string& k, V v) {
    if (!has(k)) items.emplace_back(k, std::move(v));
  }
  void set(const std::string& k, V v) {  // a key set before keeps its place
    for (auto& [key, value] : items)
      if (key == k) return (void)(value = std::move(v));
    items.emplace_back(k, std::move(v));
  }
};

struct SpecialTokens {
  Ordered<uint64_t> ids;  // special_token_ids: bos, eos, unk, sep, pad, cls, mask, eot, eom
  Ordered<bool> add;      // add_special_token: whether the tokenizer adds bos, eos, sep
  std::optional<std::string> chat_template;
};

// `tokenizer`: tokenizer.json; `tokenizer_config`: tokenizer_config.json (an object; {} where there is none);
// `config`: config.json. Follows the ByteLevel and TemplateProcessing post-processors, alone or in a
// Sequence; throws Refusal for any other, and for a chat template that is a list.
SpecialTokens read_special_tokens(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                                  const nlohmann::json& config);

}  // namespace ckptfs::views::gguf
