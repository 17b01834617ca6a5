#include "views/gguf/bpe_encoder.hpp"

#include <fmt/format.h>

#include <array>
#include <bitset>
#include <cstdint>
#include <string_view>
#include <unordered_set>

#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards.
const std::array<std::string, 256>& byte_symbols() {
  static const auto table = [] {
    std::array<std::string, 256> out;
    char32_t next = 256;
    for (unsigned b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      const char32_t c = printable ? b : next++;
      out[b] = c < 0x80
                   ? std::string(1, static_cast<char>(c))
                   : std::string{static_cast<char>(0xc0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3f))};
    }
    return out;
  }();
  return table;
}

std::vector<std::string> symbols_of(const std::string& word) {
  std::vector<std::string> out;
  for (char b : word) out.push_back(byte_symbols()[static_cast<unsigned char>(b)]);
  return out;
}

// The runs of symbols of the words, asked about once per merge: a bitmap over a cheap key (length, first and
// last byte) answers most merges, which cannot apply, before the set is hashed into.
class Runs {
 public:
  explicit Runs(const std::vector<std::string>& words) {
    for (const auto& word : words) {
      const auto symbols = symbols_of(word);
      for (size_t i = 0; i < symbols.size(); ++i) {
        std::string run;
        for (size_t j = i; j < symbols.size(); ++j) {
          run += symbols[j];
          seen_[key(run)] = true;
          runs_.insert(run);
        }
      }
    }
  }

  bool contains(std::string_view s) const { return !s.empty() && seen_[key(s)] && runs_.contains(s); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static size_t key(std::string_view s) {
    return (s.size() * 65599 + static_cast<unsigned char>(s.front()) * 257 +
            static_cast<unsigned char>(s.back())) &
           0xffff;
  }

  std::bitset<0x10000> seen_;
  std::unordered_set<std::string, Hash, std::equal_to<>> runs_;
};

// A merge's two parts: "left right" (one space) or, as tokenizers >= 0.20 writes them, ["left", "right"].
std::pair<std::string_view, std::string_view> parts_of(const json& merge) {
  if (merge.is_string()) {
    const std::string_view s = merge.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos)
      throw Refusal("tokenizer.json: a merge without one space");
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get_ref<const std::string&>(), merge[1].get_ref<const std::string&>()};
  throw Refusal("tokenizer.json: model.merges in an unknown format");
}

}  // namespace

BpeEncoder::BpeEncoder(const json& model, bool ignore_merges, const std::vector<std::string>& words)
    : vocab_(model.at("vocab")), ignore_merges_(ignore_merges) {
  if (!vocab_.is_object()) throw Refusal("tokenizer.json: model.vocab is not an object");
  const Runs inside(words);
  const auto merges = model.find("merges");
  if (merges == model.end()) return;
  if (!merges->is_array()) throw Refusal("tokenizer.json: model.merges is not a list");
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const auto [left, right] = parts_of((*merges)[rank]);
    if (inside.contains(left) && inside.contains(right))
      ranks_.insert_or_assign(fmt::format("{} {}", left, right), rank);  // a repeated merge: the last rank
  }
}

int64_t BpeEncoder::id_of(const std::string& symbol) const {
  const auto it = vocab_.find(symbol);
  if (it == vocab_.end() || !it->is_number_integer())
    throw Refusal(fmt::format("tokenizer.json: the check text needs {}, not in the vocabulary", symbol));
  return it->get<int64_t>();
}

void BpeEncoder::encode(const std::string& word, std::vector<int64_t>& ids) const {
  std::vector<std::string> symbols = symbols_of(word);
  if (ignore_merges_) {  // a word that is a token is that token, whatever the merges would make of it
    std::string whole;
    for (const auto& s : symbols) whole += s;
    if (const auto it = vocab_.find(whole); it != vocab_.end()) return ids.push_back(id_of(whole));
  }
  while (symbols.size() > 1) {  // merge the adjacent pair of lowest rank, leftmost first
    size_t best = 0, best_rank = SIZE_MAX;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (const auto it = ranks_.find(symbols[i] + " " + symbols[i + 1]);
          it != ranks_.end() && it->second < best_rank)
        best = i, best_rank = it->second;
    if (best_rank == SIZE_MAX) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
  for (const auto& s : symbols) ids.push_back(id_of(s));
}

}  // namespace ckptfs::views::gguf
