// The key-value encoding against bytes written out from ggml's docs/gguf.md and gguf-py's writer rules.
#include "views/gguf/gguf_kv.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ckptfs::views::gguf {
namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

TEST(GgufKv, EncodesStringsAndNumbersLittleEndian) {
  KvList kv;
  kv.add_string("a", "gpt2");
  kv.add_u32("b", 0x01020304);
  kv.add_f32("c", 1.0);
  kv.add_bool("d", true);
  const std::string want = bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "a" +
                           bytes({8, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}) + "gpt2" +
                           bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "b" + bytes({4, 0, 0, 0, 4, 3, 2, 1}) +
                           bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "c" + bytes({6, 0, 0, 0, 0, 0, 0x80, 0x3f}) +
                           bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "d" + bytes({7, 0, 0, 0, 1});
  EXPECT_EQ(kv.encode(), want);
  EXPECT_EQ(kv.size(), 4u);
}

TEST(GgufKv, DropsEmptyValuesAndKeepsTheFirstPositionOfAReplacedKey) {
  KvList kv;
  kv.add_u32("x", 1);
  kv.add_string("empty", "");
  const std::vector<std::string> none;
  kv.add_strings("none", none);
  kv.add_u32("y", 2);
  kv.add_u32("x", 3);  // replaced in place, as a Python dict keeps the key's position
  EXPECT_EQ(kv.size(), 2u);
  const std::string want = bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "x" + bytes({4, 0, 0, 0, 3, 0, 0, 0}) +
                           bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "y" + bytes({4, 0, 0, 0, 2, 0, 0, 0});
  EXPECT_EQ(kv.encode(), want);
}

TEST(GgufKv, ArraysCarryTheirElementTypeAndCount) {
  KvList kv;
  const std::vector<std::string> tokens = {"a", "bc"};
  kv.add_strings("t", tokens);
  const std::vector<int32_t> types = {1, -1};
  kv.add_i32s("u", types);
  const std::string want =
      bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "t" + bytes({9, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}) +
      bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "a" + bytes({2, 0, 0, 0, 0, 0, 0, 0}) + "bc" +
      bytes({1, 0, 0, 0, 0, 0, 0, 0}) + "u" + bytes({9, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}) +
      bytes({1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff});
  EXPECT_EQ(kv.encode(), want);
}

}  // namespace
}  // namespace ckptfs::views::gguf
