// Expected answers are Python 3.11's re.match(pattern, name) on the same pair (the semantics
// ds_to_universal applies), not NamePattern's own output.
#include "formats/deepspeed/name_pattern.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace ckptfs::deepspeed {
namespace {

bool python_match(std::string_view pattern, std::string_view name) {
  std::string error;
  const NamePattern p = NamePattern::compile(pattern, &error);
  EXPECT_TRUE(p.ok()) << pattern << ": " << error;
  return p.ok() && p.matches(name);
}

TEST(NamePattern, MatchesLikePythonReMatch) {
  struct Case {
    const char* pattern;
    const char* name;
    bool python;
  };
  const Case cases[] = {
      {R"(^model\.layers\.0\.mlp\.down_proj\.weight$)", "model.layers.0.mlp.down_proj.weight", true},
      {R"(^model\.layers\.0\.mlp\.down_proj\.weight$)", "model.layers.0.mlp.down_proj.weight.extra", false},
      {R"(\d+\.input_layernorm)", "3.input_layernorm.weight", true},
      {R"(input_layernorm)", "3.input_layernorm.weight", false},  // anchored at the start, not searched
      {R"(layers\.\d+\.mlp\.dense_4h_to_h\.weight)", "layers.12.mlp.dense_4h_to_h.weight", true},
      {R"(a{,2}b)", "aab", true},
      {R"(a{,2}b)", "aaab", false},
      {R"(x{,}y)", "xxxy", true},
      {R"(a{x)", "a{x", true},
      {R"(w\Z)", "w", true},
      {R"(w\Z)", "wx", false},
      {R"([]a]+z)", "]a]z", true},
      {R"([^]a]z)", "bz", true},
      {R"([\]]z)", "]z", true},
      {R"((?i)LM_head)", "lm_head.weight", true},
      {R"((?:a|b)c)", "bc", true},
      {R"((?P<n>x)y)", "xy", true},
  };
  for (const auto& c : cases)
    EXPECT_EQ(python_match(c.pattern, c.name), c.python) << c.pattern << " on " << c.name;
}

TEST(NamePattern, RefusesSyntaxOutsideTheSharedSubset) {
  for (const char* pattern :
       {R"((?=a))", R"((a)\1)", R"((?x)a)", R"((?<=a)b)", R"((?#c)a)", R"((?P=n))", R"((?>a))", R"(\pL)",
        R"([[:alpha:]])", R"(a\)", R"((?U)a)", R"(\x{41})", "(a"}) {
    std::string error;
    EXPECT_FALSE(NamePattern::compile(pattern, &error).ok()) << pattern;
    EXPECT_FALSE(error.empty()) << pattern;
  }
}

// Python's backtracking engine takes exponential time on this pair; RE2 is linear.
TEST(NamePattern, NestedRepetitionRunsInLinearTime) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(python_match("(a+)+$", std::string(100000, 'a') + "!"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace ckptfs::deepspeed
