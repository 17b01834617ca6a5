#include "formats/deepspeed/name_pattern.hpp"

#include <re2/re2.h>

#include <cctype>

namespace ckptfs::deepspeed {

namespace {

// Compiled programs and their DFA caches are bounded per pattern (RE2 falls back to its NFA, still
// linear, when a DFA outgrows this); a pattern whose program alone is larger does not compile.
constexpr int64_t kMaxMemoryPerPattern = 1 << 20;

bool refuse(std::string* error, std::string what) {
  *error = std::move(what);
  return false;
}

class Translator {
 public:
  explicit Translator(std::string_view p) : p_(p) {}

  bool run(std::string* error) {
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        if (!escape(error)) return false;
      } else if (class_open_) {
        if (c == '[' && next_is(':')) return refuse(error, "POSIX classes such as [[:alpha:]] (RE2 only)");
        if (c == ']' && i_ > class_body_) class_open_ = false;
        out_ += c;
        ++i_;
      } else if (c == '[') {
        open_class();
      } else if (c == '(' && next_is('?')) {
        if (!group(error)) return false;
      } else if (c == '{' && next_is(',')) {
        open_ended_repeat();
      } else {
        out_ += c;
        ++i_;
      }
    }
    return true;
  }
  std::string take() { return std::move(out_); }

 private:
  bool next_is(char c) const { return i_ + 1 < p_.size() && p_[i_ + 1] == c; }

  bool escape(std::string* error) {
    if (i_ + 1 == p_.size()) return refuse(error, "a trailing backslash");
    const char d = p_[i_ + 1];
    if (d >= '1' && d <= '9') return refuse(error, "backreferences");
    if (std::string_view("pPCQE").find(d) != std::string_view::npos)
      return refuse(error, std::string("the RE2-only escape \\") + d);
    if (d == 'x' && i_ + 2 < p_.size() && p_[i_ + 2] == '{')
      return refuse(error, "the RE2-only escape \\x{...}");
    // Python's \Z (end of string) is RE2's \z.
    out_ += '\\';
    out_ += (d == 'Z' && !class_open_) ? 'z' : d;
    i_ += 2;
    return true;
  }

  // A ']' right after '[' or '[^' is a literal in both dialects.
  void open_class() {
    out_ += '[';
    ++i_;
    if (i_ < p_.size() && p_[i_] == '^') out_ += p_[i_++];
    class_body_ = i_;
    class_open_ = true;
  }

  // (?:...), (?P<name>...) and the i, m, s flags mean the same in both; the rest is refused.
  bool group(std::string* error) {
    const size_t start = i_ + 2;
    if (start < p_.size() && (p_[start] == ':' || p_.substr(start, 2) == "P<")) {
      out_ += p_.substr(i_, 3);
      i_ += 3;
      return true;
    }
    size_t j = start;
    while (j < p_.size() && (std::isalpha(static_cast<unsigned char>(p_[j])) || p_[j] == '-')) {
      if (std::string_view("ims-").find(p_[j]) == std::string_view::npos)
        return refuse(error, std::string("the inline flag ") + p_[j]);
      ++j;
    }
    if (j == start || j == p_.size() || (p_[j] != ':' && p_[j] != ')'))
      return refuse(error, "lookaround, comments, conditionals, atomic groups or named backreferences");
    out_ += p_.substr(i_, j + 1 - i_);
    i_ = j + 1;
    return true;
  }

  // Python reads {,n} as {0,n}; RE2 as literal text.
  void open_ended_repeat() {
    size_t j = i_ + 2;
    while (j < p_.size() && std::isdigit(static_cast<unsigned char>(p_[j]))) ++j;
    out_ += (j < p_.size() && p_[j] == '}') ? "{0" : "{";
    ++i_;
  }

  std::string_view p_;
  size_t i_ = 0;
  bool class_open_ = false;
  size_t class_body_ = 0;  // the open class's first character (a ']' there is a literal)
  std::string out_;
};

}  // namespace

std::optional<std::string> python_pattern_to_re2(std::string_view pattern, std::string* error) {
  Translator t(pattern);
  if (!t.run(error)) return std::nullopt;
  return t.take();
}

NamePattern NamePattern::compile(std::string_view python_pattern, std::string* error) {
  NamePattern out;
  out.text_ = std::string(python_pattern);
  const auto translated = python_pattern_to_re2(python_pattern, error);
  if (!translated) return out;
  RE2::Options options;
  options.set_log_errors(false);
  options.set_max_mem(kMaxMemoryPerPattern);
  auto re = std::make_shared<const RE2>(*translated, options);
  if (!re->ok()) {
    *error = re->error();
    return out;
  }
  out.re_ = std::move(re);
  return out;
}

bool NamePattern::matches(std::string_view name) const {
  return re_->Match(re2::StringPiece(name.data(), name.size()), 0, name.size(), RE2::ANCHOR_START, nullptr,
                    0);
}

}  // namespace ckptfs::deepspeed
