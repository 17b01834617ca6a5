#include "views/gguf/pre_tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>
#include <vector>

#include "views/gguf/hf_directory.hpp"
#include "views/gguf/sha256.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

// The converter's check text (conversion/base.py, chktxt).
constexpr std::string_view kCheckText =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\xe2\x80\x8d"
    "🌫\xef\xb8\x8f"
    " (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make "
    "it, "
    "'D you like some tea? We'Ve a'lL";

// The converter's names of the hashes ckptfs can produce (each appears once in its chain of ifs).
const std::map<std::string, std::string, std::less<>> kKnownHashes = {
    {"3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"}};

enum class Category { letter, number, space, other };

// Unicode's general category for the code points of the check text (the text is fixed: a table of its
// non-ASCII letters is enough; everything else in it is a symbol, mark or format character).
Category category(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Category::letter;
    if (c >= '0' && c <= '9') return Category::number;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return Category::space;
    return Category::other;
  }
  const bool cyrillic = c >= 0x410 && c <= 0x44f;        // А..я (Lu, Ll)
  const bool khmer_letter = c >= 0x1780 && c <= 0x17b3;  // KA..AU (Lo)
  const bool cjk = c >= 0x4e00 && c <= 0x9fff;           // unified ideographs (Lo)
  if (cyrillic || khmer_letter || cjk) return Category::letter;
  const bool khmer_sign = c >= 0x17b4 && c <= 0x17d3;  // vowel signs, marks (Mc, Mn)
  const bool known_other = khmer_sign || c == 0x200d || c == 0xfe0f || c == 0x2705 || c == 0xff5e ||
                           (c >= 0x1f300 && c <= 0x1f9ff);  // ZWJ, VS16, ✅, ～, emoji (So)
  if (!known_other) throw Refusal(fmt::format("no category for U+{:04X}", static_cast<uint32_t>(c)));
  return Category::other;
}

struct CodePoint {
  char32_t value;
  size_t begin, end;  // byte range in the text
};

std::vector<CodePoint> decode_utf8(std::string_view s) {
  std::vector<CodePoint> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
    char32_t c = n == 1 ? b : b & (0x3f >> (n - 1));
    for (size_t k = 1; k < n; ++k) c = c << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back({c, i, i + n});
    i += n;
  }
  return out;
}

// GPT-2's split (tokenizers' ByteLevel with use_regex):
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string> split_gpt2(std::string_view text) {
  const auto cps = decode_utf8(text);
  std::vector<Category> cat;
  for (const auto& c : cps) cat.push_back(category(c.value));
  const size_t n = cps.size();
  const auto run = [&](size_t from, Category k) {
    size_t j = from;
    while (j < n && cat[j] == k) ++j;
    return j;
  };
  std::vector<std::string> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = i;
    const auto at = [&](size_t j, char32_t c) { return j < n && cps[j].value == c; };
    if (at(i, '\'')) {
      for (std::u32string_view suffix : {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"}) {
        size_t k = 0;
        while (k < suffix.size() && at(i + 1 + k, suffix[k])) ++k;
        if (k == suffix.size()) {
          end = i + 1 + k;
          break;
        }
      }
    }
    for (Category k : {Category::letter, Category::number, Category::other}) {
      if (end != i) break;
      const size_t start = at(i, ' ') && i + 1 < n && cat[i + 1] == k ? i + 1 : i;
      if (cat[start] == k) end = run(start, k);
    }
    if (end == i) {  // whitespace: \s+(?!\S), else \s+
      const size_t all = run(i, Category::space);
      end = all == n || all - i == 1 ? all : all - 1;
    }
    pieces.emplace_back(text.substr(cps[i].begin, cps[end - 1].end - cps[i].begin));
    i = end;
  }
  return pieces;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onwards.
std::array<std::string, 256> byte_symbols() {
  std::array<std::string, 256> out;
  char32_t next = 256;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    const char32_t c = printable ? b : next++;
    out[b] = c < 0x80 ? std::string(1, static_cast<char>(c))
                      : std::string{static_cast<char>(0xc0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3f))};
  }
  return out;
}

class Bpe {
 public:
  explicit Bpe(const json& model) {
    const json vocab = model.value("vocab", json::object());
    for (const auto& [token, id] : vocab.items()) vocab_[token] = id.get<int64_t>();
    const json merges = model.value("merges", json::array());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& m = merges[rank];
      std::string pair;
      if (m.is_string()) {
        pair = m.get<std::string>();
        if (std::count(pair.begin(), pair.end(), ' ') != 1)
          throw Refusal("tokenizer.json: a merge without one space");
      } else {
        pair = m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
      }
      ranks_.emplace(std::move(pair), rank);
    }
    ignore_merges_ = model.value("ignore_merges", false);
  }

  // The ids of one pre-token (its byte-level symbols).
  void encode(const std::vector<std::string>& symbols_in, std::vector<int64_t>& ids) const {
    std::string whole;
    for (const auto& s : symbols_in) whole += s;
    if (ignore_merges_)
      if (const auto it = vocab_.find(whole); it != vocab_.end()) return ids.push_back(it->second);
    std::vector<std::string> symbols = symbols_in;
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
    for (const auto& s : symbols) {
      const auto it = vocab_.find(s);
      if (it == vocab_.end())
        throw Refusal(fmt::format("tokenizer.json: the check text needs {}, not in the vocabulary", s));
      ids.push_back(it->second);
    }
  }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, size_t> ranks_;
  bool ignore_merges_ = false;
};

// The check text's pre-tokens, or a Refusal for a pre-tokenizer ckptfs does not split yet.
std::vector<std::string> pre_tokens(const json& pre) {
  if (pre.value("type", "") == "ByteLevel" && pre.value("use_regex", true) &&
      !pre.value("add_prefix_space", true))
    return split_gpt2(kCheckText);
  throw Refusal(fmt::format("tokenizer.json: pre-tokenizer {} not encoded by ckptfs yet", pre.dump()));
}

std::string identify(const json& tokenizer) {
  const json normalizer = tokenizer.value("normalizer", json());
  // the check text is in NFC already: an NFC normalizer leaves it as it is
  if (!normalizer.is_null() && normalizer.value("type", "") != "NFC")
    throw Refusal(
        fmt::format("tokenizer.json: normalizer {} not encoded by ckptfs yet", normalizer.value("type", "")));
  for (const auto& added : tokenizer.value("added_tokens", json::array()))
    if (const std::string content = added.value("content", "");
        !content.empty() && kCheckText.find(content) != std::string_view::npos)
      throw Refusal(fmt::format("tokenizer.json: added token {} occurs in the check text", content));
  const json model = tokenizer.value("model", json::object());
  for (const char* unsupported : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"})
    if (const json v = model.value(unsupported, json()); !v.is_null() && v != json(""))
      throw Refusal(fmt::format("tokenizer.json: BPE {} not encoded by ckptfs yet", unsupported));
  const json post = tokenizer.value("post_processor", json());
  if (!post.is_null() && post.value("type", "") != "ByteLevel")
    throw Refusal(
        fmt::format("tokenizer.json: post-processor {} not encoded by ckptfs yet", post.value("type", "")));
  const Bpe bpe(model);
  static const auto symbols_of = byte_symbols();
  std::vector<int64_t> ids;
  for (const auto& piece : pre_tokens(tokenizer.value("pre_tokenizer", json()))) {
    std::vector<std::string> symbols;
    for (char b : piece) symbols.push_back(symbols_of[static_cast<unsigned char>(b)]);
    bpe.encode(symbols, ids);
  }
  std::string printed = "[";  // Python's str(list)
  for (size_t i = 0; i < ids.size(); ++i) printed += fmt::format("{}{}", i ? ", " : "", ids[i]);
  printed += "]";
  const std::string hash = sha256_hex(printed);
  const auto it = kKnownHashes.find(hash);
  if (it == kKnownHashes.end())
    throw Refusal(
        fmt::format("the converter would not recognise this BPE pre-tokenizer (check text hash {}): "
                    "-o gguf_pre=NAME names it",
                    hash));
  return it->second;
}

}  // namespace

std::string identify_pre_tokenizer(const json& tokenizer) {
  try {
    return identify(tokenizer);
  } catch (const json::exception& e) {
    throw Refusal(fmt::format("tokenizer.json: {}", e.what()));
  }
}

}  // namespace ckptfs::views::gguf
