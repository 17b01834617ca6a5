#include "views/gguf/pre_tokenizer_split.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

enum class Category { letter, number, space, other };

// Unicode's general category for the code points of the check text (a table of its non-ASCII letters is
// enough; everything else in it is a symbol, mark or format character). The check text is fixed, so the
// table need not be Unicode's whole.
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
  Category category;
  size_t begin, end;  // byte range in the text
};

std::vector<CodePoint> decode_utf8(std::string_view s) {
  std::vector<CodePoint> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = std::min(b < 0x80 ? size_t{1} : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4, s.size() - i);
    char32_t c = n == 1 ? b : b & (0x3f >> (n - 1));
    for (size_t k = 1; k < n; ++k) c = c << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back({c, category(c), i, i + n});
    i += n;
  }
  return out;
}

// Where one match of the regex starting at `i` ends: the first alternative that matches, with the
// backtracking of Oniguruma's greedy quantifiers. Every character is matched by one of the last alternatives
// or \s+.
class Matcher {
 public:
  Matcher(const std::vector<CodePoint>& cps, SplitRegex regex) : cps_(cps), regex_(regex) {}

  size_t end_of_match(size_t i) const {
    if (const size_t end = contraction(i); end != i) return end;
    return regex_ == SplitRegex::gpt2 ? gpt2(i) : llama3(i);
  }

 private:
  bool is(size_t j, Category k) const { return j < cps_.size() && cps_[j].category == k; }
  bool is_newline(size_t j) const {
    return j < cps_.size() && (cps_[j].value == '\r' || cps_[j].value == '\n');
  }
  size_t run(size_t j, Category k) const {
    while (is(j, k)) ++j;
    return j;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, case-insensitive (ASCII folding is all the check text needs) but for GPT-2
  size_t contraction(size_t i) const {
    if (i >= cps_.size() || cps_[i].value != '\'') return i;
    const bool fold = regex_ != SplitRegex::gpt2;
    for (std::u32string_view suffix : {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"}) {
      size_t k = 0;
      for (; k < suffix.size() && i + 1 + k < cps_.size(); ++k) {
        char32_t c = cps_[i + 1 + k].value;
        if (fold && c >= 'A' && c <= 'Z') c += 'a' - 'A';
        if (c != suffix[k]) break;
      }
      if (k == suffix.size()) return i + 1 + k;
    }
    return i;
  }

  // \s+(?!\S)|\s+: a run of whitespace, less its last character where a non-space follows
  size_t whitespace(size_t i) const {
    const size_t all = run(i, Category::space);
    return all == cps_.size() || all - i == 1 ? all : all - 1;
  }

  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`, then whitespace
  size_t gpt2(size_t i) const {
    for (Category k : {Category::letter, Category::number, Category::other}) {
      const size_t start = cps_[i].value == ' ' && is(i + 1, k) ? i + 1 : i;
      if (is(start, k)) return run(start, k);
    }
    return whitespace(i);
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+, then whitespace
  size_t llama3(size_t i) const {
    const Category k = cps_[i].category;
    if (k == Category::letter) return run(i, Category::letter);
    if (k != Category::number && !is_newline(i) && is(i + 1, Category::letter))
      return run(i + 1, Category::letter);
    if (k == Category::number)
      return std::min(run(i, Category::number), i + (regex_ == SplitRegex::llama3 ? 3 : 1));
    const size_t start = cps_[i].value == ' ' && is(i + 1, Category::other) ? i + 1 : i;
    if (is(start, Category::other)) {
      size_t end = run(start, Category::other);
      while (is_newline(end)) ++end;
      return end;
    }
    const size_t spaces = run(i, Category::space);  // \s*[\r\n]+: up to the run's last line break
    for (size_t j = spaces; j > i; --j)
      if (is_newline(j - 1)) return j;
    return whitespace(i);
  }

  const std::vector<CodePoint>& cps_;
  SplitRegex regex_;
};

}  // namespace

std::optional<SplitRegex> split_regex_of(std::string_view pattern) {
  static constexpr std::string_view kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  if (pattern == kLlama3) return SplitRegex::llama3;
  if (pattern == kQwen2) return SplitRegex::qwen2;
  if (pattern == kGpt2) return SplitRegex::gpt2;
  return std::nullopt;
}

std::vector<std::string> split_text(std::string_view text, SplitRegex regex) {
  const auto cps = decode_utf8(text);
  const Matcher matcher(cps, regex);
  std::vector<std::string> pieces;
  for (size_t i = 0; i < cps.size();) {
    const size_t end = matcher.end_of_match(i);
    pieces.emplace_back(text.substr(cps[i].begin, cps[end - 1].end - cps[i].begin));
    i = end;
  }
  return pieces;
}

}  // namespace ckptfs::views::gguf
