#include "views/gguf/gguf_naming.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>
#include <set>
#include <vector>

namespace ckptfs::views::gguf {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alpha(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0;
}
bool is_lower(char c) {
  return c >= 'a' && c <= 'z';
}
bool is_upper(char c) {
  return c >= 'A' && c <= 'Z';
}

// Python's str.islower on ASCII: some cased letter, none upper case.
bool python_islower(std::string_view w) {
  return std::any_of(w.begin(), w.end(), is_lower) && std::none_of(w.begin(), w.end(), is_upper);
}

// Python's str.title on ASCII: a letter after a non-letter upper case, the others lower case.
std::string python_title(std::string_view w) {
  std::string out;
  bool after_letter = false;
  for (char c : w) {
    out += static_cast<char>(after_letter ? std::tolower(static_cast<unsigned char>(c))
                                          : std::toupper(static_cast<unsigned char>(c)));
    after_letter = is_alpha(c);
  }
  return out;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = s.find(sep, start)) != std::string_view::npos; start = end + 1)
    out.emplace_back(s.substr(start, end - start));
  out.emplace_back(s.substr(start));
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : std::string(sep)) + p;
  return out;
}

// Metadata.id_to_title: words (at '-' and spaces) title-cased unless not all lower case, a version or
// starting with a digit.
std::string id_to_title(std::string_view id) {
  static const std::regex kKeep(R"(v\d+(?:\.\d+)*|\d.*)");
  std::string spaced(id);
  std::replace(spaced.begin(), spaced.end(), '-', ' ');
  std::vector<std::string> words;
  for (auto& w : split(spaced, ' '))
    if (!w.empty()) words.push_back(python_islower(w) && !std::regex_match(w, kKeep) ? python_title(w) : w);
  return join(words, " ");
}

enum Kind { kBasename = 1, kSizeLabel = 2, kFinetune = 4, kVersion = 8, kType = 16 };

// A size part such as "7B" read as a parameter count, as float(part[:-1]) * 1000 ** " KMBT".find(part[-1]);
// nullopt where Python's float() fails.
std::optional<double> label_parameters(const std::string& part) {
  static const std::regex kFloat(R"([0-9]+(\.[0-9]*)?|\.[0-9]+)");
  const std::string number = part.substr(0, part.size() - 1);
  if (!std::regex_match(number, kFloat)) return std::nullopt;
  const auto scale = static_cast<int>(std::string_view(" KMBT").find(part.back()));
  return std::strtod(number.c_str(), nullptr) * std::pow(1000.0, scale);
}

// Metadata.get_model_id_components for a model id without '/' or ' ' (a directory name): basename,
// finetune, version and size label.
ModelNaming id_components(std::string_view id, uint64_t total_params) {
  static const std::regex kVersionPart(R"((v|iter)?\d+([.]\d+)*)", std::regex::icase);
  static const std::regex kTypePart(R"(i?q\d(_\w)*|b?fp?(16|32))", std::regex::icase);
  static const std::regex kSize(R"((([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl))",
                                std::regex::icase);
  static const std::regex kFinetuneWord(R"(chat|instruct|vision|lora)", std::regex::icase);
  std::vector<std::string> parts;
  for (auto& p : split(id, '-'))
    if (!p.empty()) parts.push_back(p);
  std::vector<int> kinds(parts.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string& part = parts[i];
    if (std::regex_match(part, kVersionPart)) {
      kinds[i] |= kVersion;
    } else if (std::regex_match(part, kTypePart)) {
      kinds[i] |= kType;
      std::transform(part.begin(), part.end(), part.begin(), [](char c) { return std::toupper(c); });
    } else if (i > 0 && std::regex_match(part, kSize)) {
      std::replace(part.begin(), part.end(), '_', '.');
      if (is_digit(part.back()))  // bloom-7b1 -> 7.1b
        part = part.substr(0, part.size() - 2) + "." + part.back() + part[part.size() - 2];
      if (part.size() > 1 && is_digit(part[part.size() - 2]) &&
          std::string_view("kmbt").find(part.back()) != std::string_view::npos)
        part.back() = static_cast<char>(std::toupper(part.back()));
      if (total_params != 0)
        if (const auto label = label_parameters(part)) {
          const auto total = static_cast<double>(total_params);
          if (std::abs(*label - total) > static_cast<double>(7 * total_params / 8)) {  // a context length
            kinds[i] |= kFinetune;
            part.back() = static_cast<char>(std::tolower(part.back()));
          }
        }
      if (kinds[i] == 0) kinds[i] |= kSizeLabel;
    } else if (i > 0 && std::regex_match(part, kFinetuneWord)) {
      kinds[i] |= kFinetune;
    }
  }
  // word-based size labels dropped where a number-based one is present
  bool numeric_size = false;
  for (size_t i = 0; i < parts.size(); ++i)
    if (kinds[i] & kSizeLabel) numeric_size |= std::any_of(parts[i].begin(), parts[i].end(), is_digit);
  if (numeric_size)
    for (size_t i = 0; i < parts.size(); ++i)
      if ((kinds[i] & kSizeLabel) && std::all_of(parts[i].begin(), parts[i].end(), is_alpha))
        kinds[i] &= ~kSizeLabel;
  bool at_start = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (at_start && ((kinds[i] == 0 && is_alpha(parts[i][0])) || (kinds[i] & kVersion))) {
      kinds[i] |= kBasename;
    } else {
      at_start = false;
      if (kinds[i] == 0) kinds[i] |= kFinetune;
    }
  }
  for (size_t i = parts.size(); i-- > 0;) {  // a trailing version is not the basename's
    if (!((kinds[i] & kBasename) && kinds[i] != kBasename)) break;
    kinds[i] &= ~kBasename;
  }
  const auto joined = [&](int kind, int without, bool distinct) -> std::optional<std::string> {
    std::vector<std::string> picked;
    for (size_t i = 0; i < parts.size(); ++i)
      if ((kinds[i] & kind) && !(kinds[i] & without) &&
          !(distinct && std::find(picked.begin(), picked.end(), parts[i]) != picked.end()))
        picked.push_back(parts[i]);
    return picked.empty() ? std::nullopt : std::optional(join(picked, "-"));
  };
  ModelNaming n;
  n.basename = joined(kBasename, 0, false);
  n.size_label = joined(kSizeLabel, 0, true);
  n.finetune = joined(kFinetune, 0, false);
  n.version = joined(kVersion, kBasename, false);
  if (!n.size_label && !n.finetune && !n.version) n.basename.reset();  // too ambiguous
  return n;
}

// utility.py's model_weight_count_rounded_notation(count, min_digits=2): "6.7M", "17M", "3.3B".
std::string rounded_notation(uint64_t count) {
  const auto n = static_cast<double>(count);
  double scaled = n * 1e-3;
  char suffix = 'K';
  if (n > 1e12)
    scaled = n * 1e-12, suffix = 'T';
  else if (n > 1e9)
    scaled = n * 1e-9, suffix = 'B';
  else if (n > 1e6)
    scaled = n * 1e-6, suffix = 'M';
  const std::string digits =
      fmt::format("{}", static_cast<uint64_t>(std::nearbyint(scaled)));  // half to even
  const size_t significant = digits == "0" ? 0 : digits.size();
  const int fix = std::max(2 - static_cast<int>(significant), 0);
  return fmt::format("{:.{}f}{}", scaled, fix, suffix);
}

}  // namespace

bool valid_directory_name(std::string_view directory) {
  return !directory.empty() && directory.front() != '.' &&
         std::any_of(directory.begin(), directory.end(), [](char c) { return is_alpha(c) || is_digit(c); }) &&
         std::all_of(directory.begin(), directory.end(),
                     [](char c) { return is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-'; });
}

ModelNaming name_model(std::string_view directory, const ParameterCount& count) {
  ModelNaming n = id_components(directory, count.total);
  n.name = id_to_title(directory);
  if (!n.size_label && count.total > 0)  // utility.py's size_label
    n.size_label = count.expert_count > 0 ? fmt::format("{}x{}", count.expert_count,
                                                        rounded_notation(count.shared + count.expert))
                                          : rounded_notation(count.total);
  return n;
}

void add_naming(KvList& kv, const ModelNaming& n) {
  kv.add_string("general.name", n.name);
  if (n.version) kv.add_string("general.version", *n.version);
  if (n.finetune) kv.add_string("general.finetune", *n.finetune);
  if (n.basename) kv.add_string("general.basename", *n.basename);
  if (n.size_label) kv.add_string("general.size_label", *n.size_label);
}

std::string gguf_file_name(const ModelNaming& n, std::string_view outtype) {
  const auto dashed = [](std::string s) {
    std::replace(s.begin(), s.end(), ' ', '-');
    return s;
  };
  std::string out = dashed(n.basename ? *n.basename : n.name);
  for (const auto& part : {n.size_label, n.finetune, n.version})
    if (part) out += "-" + dashed(*part);
  return fmt::format("{}-{}.gguf", out, outtype);
}

}  // namespace ckptfs::views::gguf
