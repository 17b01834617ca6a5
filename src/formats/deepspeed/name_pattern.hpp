// Python regular expressions taken from a checkpoint (universal_checkpoint_info's pattern lists), matched
// as DeepSpeed's ds_to_universal matches them, `re.match(pattern, name)`: anchored at the start only.
// They come from an untrusted pickle, so they run on RE2 (linear time, bounded memory), never on a
// backtracking engine. Supported: the syntax Python's re and RE2 share with one meaning (literals,
// escapes, classes, groups, alternation, repetition, anchors, the i/m/s flags); `\Z` and `{,n}` are
// translated. Anything else (lookaround, backreferences, `(?x)`, RE2-only `\p`, `\Q`, `[[:alpha:]]`) is
// refused rather than matched differently. Known differences, documented in docs/formats/deepspeed.md:
// `\d`, `\w`, `\s`, `\b` are ASCII classes (Python's are Unicode), and `$` does not match before a final
// newline of the name.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace re2 {
class RE2;
}

namespace ckptfs::deepspeed {

class NamePattern {
 public:
  // The compiled pattern, or the reason it is outside the supported syntax.
  static NamePattern compile(std::string_view python_pattern, std::string* error);

  const std::string& text() const { return text_; }
  bool ok() const { return re_ != nullptr; }
  // re.match: does the pattern match a prefix of `name`?
  bool matches(std::string_view name) const;

 private:
  std::string text_;
  std::shared_ptr<const re2::RE2> re_;
};

// The RE2 spelling of a Python pattern, or nullopt with `error` set for syntax outside the shared subset.
std::optional<std::string> python_pattern_to_re2(std::string_view pattern, std::string* error);

}  // namespace ckptfs::deepspeed
