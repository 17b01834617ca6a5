// ckptfs's reading of special tokens against what gguf-py's SpecialVocab read from the same files
// (mount_tests/fixtures/gguf-special-tokens, README.md there).
#include "views/gguf/special_tokens.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {
namespace {

using nlohmann::json;

const std::filesystem::path kCases =
    std::filesystem::path(CKPTFS_SOURCE_DIR) / "mount_tests/fixtures/gguf-special-tokens/cases.json";

json pairs(const auto& ordered) {
  json out = json::array();
  for (const auto& [kind, value] : ordered.items) out.push_back({kind, value});
  return out;
}

TEST(SpecialTokens, AreWhatGgufPyReadsInEveryCase) {
  std::ifstream in(kCases);
  const json cases = json::parse(in).at("cases");
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const json tokenizer_config =
        c.at("tokenizer_config").is_null() ? json::object() : c.at("tokenizer_config");
    const SpecialTokens got = read_special_tokens(c.at("tokenizer"), tokenizer_config, c.at("config"));
    json ids = c.at("ids");
    for (auto& pair : ids)  // a Python bool is an int id
      if (pair[1].is_boolean()) pair[1] = pair[1].get<bool>() ? 1 : 0;
    EXPECT_EQ(pairs(got.ids), ids);
    EXPECT_EQ(pairs(got.add), c.at("add"));
    EXPECT_EQ(got.chat_template ? json(*got.chat_template) : json(), c.at("chat_template"));
  }
}

TEST(SpecialTokens, WhatCkptfsDoesNotFollowIsRefused) {
  const json roberta = {{"post_processor", {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}}}};
  EXPECT_THROW(read_special_tokens(roberta, json::object(), json::object()), Refusal);
  const json byte_level = {{"post_processor", {{"type", "ByteLevel"}}}};
  const json templates = {{"chat_template", json::array({{{"name", "default"}, {"template", "x"}}})}};
  EXPECT_THROW(read_special_tokens(byte_level, templates, json::object()), Refusal);
  const json bad_piece = {{"post_processor", {{"type", "TemplateProcessing"}, {"single", {"A", "B"}}}}};
  EXPECT_THROW(read_special_tokens(bad_piece, json::object(), json::object()), Refusal);
}

}  // namespace
}  // namespace ckptfs::views::gguf
