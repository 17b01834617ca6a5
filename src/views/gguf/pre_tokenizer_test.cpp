// The check text's ids for the real published tokenizers (mount_tests/gen_gguf/tokenizers) against the ids
// llama.cpp's converter hashed for them in transformers 5.12 (mount_tests/fixtures/gguf-check-text, README.md
// there).
#include "views/gguf/pre_tokenizer.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {
namespace {

using nlohmann::json;

const std::filesystem::path kSource = CKPTFS_SOURCE_DIR;
const std::filesystem::path kTokenizers = kSource / "mount_tests/gen_gguf/tokenizers";

// The tokenizer files are committed xz-compressed.
std::string unxz(const std::filesystem::path& path) {
  const std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(("xz -dc '" + path.string() + "'").c_str(), "r"),
                                                   pclose);
  if (!pipe) throw std::runtime_error("cannot run xz");
  std::string out;
  char buffer[1 << 16];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe.get())) > 0;) out.append(buffer, n);
  if (out.empty()) throw std::runtime_error("xz -dc " + path.string() + " gave nothing");
  return out;
}

json published(const std::string& folder, const std::string& name) {
  return json::parse(unxz(kTokenizers / folder / (name + ".xz")));
}

// GPT-2's tokenizer.json as mount_tests/gen_gguf/make_hf_dir.py builds it from encoder.json and vocab.bpe.
json gpt2_tokenizer() {
  json merges = json::array();
  std::istringstream lines(unxz(kTokenizers / "gpt2/vocab.bpe.xz"));
  std::string line;
  std::getline(lines, line);  // #version: 0.2
  while (std::getline(lines, line))
    if (!line.empty()) merges.push_back(line);
  json vocab = json::parse(unxz(kTokenizers / "gpt2/encoder.json.xz"));
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}}}};
}

// Meta's later Llama 3 revision, as make_reference.py builds it: <|begin_of_text|> put first by a template.
json with_bos_template(json tokenizer) {
  const std::string bos = "<|begin_of_text|>";
  const json bos_item = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  const json template_processing = {
      {"type", "TemplateProcessing"},
      {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {128000}}, {"tokens", {bos}}}}}}};
  tokenizer["post_processor"] = {{"type", "Sequence"},
                                 {"processors", {tokenizer["post_processor"], template_processing}}};
  return tokenizer;
}

struct Reference {
  std::optional<std::string> pre;  // none where the converter refuses the tokenizer
  std::vector<int64_t> ids;
};

Reference reference(const std::string& name) {
  std::ifstream in(kSource / "mount_tests/fixtures/gguf-check-text" / (name + ".json"));
  const json j = json::parse(in);
  const json pre = j.at("pre");
  return {pre.is_null() ? std::nullopt : std::optional(pre.get<std::string>()),
          j.at("ids").get<std::vector<int64_t>>()};
}

class PreTokenizer : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    llama3_ = new json(published("llama3", "tokenizer.json"));
    llama3_config_ = new json(published("llama3", "tokenizer_config.json"));
    qwen3_ = new json(published("qwen3", "tokenizer.json"));
    qwen3_config_ = new json(published("qwen3", "tokenizer_config.json"));
  }
  static void TearDownTestSuite() {
    for (json* j : {llama3_, llama3_config_, qwen3_, qwen3_config_}) delete j;
  }

  static void expect_converters(const json& tokenizer, const json& config, TokenizerClass tokenizer_class,
                                const std::string& name) {
    const Reference want = reference(name);
    EXPECT_EQ(check_text_ids(tokenizer, config, tokenizer_class), want.ids);
    ASSERT_TRUE(want.pre);
    EXPECT_EQ(identify_pre_tokenizer(tokenizer, config, tokenizer_class), *want.pre);
  }

  static inline json* llama3_ = nullptr;
  static inline json* llama3_config_ = nullptr;
  static inline json* qwen3_ = nullptr;
  static inline json* qwen3_config_ = nullptr;
};

TEST_F(PreTokenizer, Gpt2IsTheConvertersGpt2) {
  const json config = {{"bos_token", "<|endoftext|>"},
                       {"eos_token", "<|endoftext|>"},
                       {"unk_token", "<|endoftext|>"},
                       {"tokenizer_class", "TokenizersBackend"}};
  expect_converters(gpt2_tokenizer(), config, TokenizerClass::backend, "gpt2");
}

TEST_F(PreTokenizer, Llama3FirstRevisionIsTheConvertersSmaugBpe) {
  expect_converters(*llama3_, *llama3_config_, TokenizerClass::backend, "llama3");
}

TEST_F(PreTokenizer, Llama3WithItsBosTemplateIsTheConvertersLlamaBpe) {
  expect_converters(with_bos_template(*llama3_), *llama3_config_, TokenizerClass::backend, "llama3-bos");
}

TEST_F(PreTokenizer, QwenIsTheConvertersQwen2AsQwen2TokenizerAndAsItsFile) {
  expect_converters(*qwen3_, *qwen3_config_, TokenizerClass::qwen2, "qwen3");
  expect_converters(*qwen3_, *qwen3_config_, TokenizerClass::backend, "qwen3");
}

TEST_F(PreTokenizer,
       AddBosTokenOfTokenizerConfigChangesNothing) {  // transformers drops it beside a tokenizer.json
  json config = *llama3_config_;
  config["add_bos_token"] = true;
  expect_converters(*llama3_, config, TokenizerClass::backend, "llama3-add-bos-token");
  config["add_bos_token"] = false;
  expect_converters(with_bos_template(*llama3_), config, TokenizerClass::backend,
                    "llama3-bos-add-bos-token-false");
}

TEST_F(PreTokenizer,
       AddPrefixSpaceOfQwen2TokenizerPrefixesEveryPiece) {  // a hash the converter does not know
  json config = *qwen3_config_;
  config["add_prefix_space"] = true;
  const Reference want = reference("qwen3-add-prefix-space");
  ASSERT_FALSE(want.pre);
  EXPECT_EQ(check_text_ids(*qwen3_, config, TokenizerClass::qwen2), want.ids);
}

TEST_F(PreTokenizer, QwenSplitOnAGpt2VocabularyIsNotKnown) {  // GPT-2's files on a qwen2 model
  const json config = {{"tokenizer_class", "TokenizersBackend"}};
  try {
    identify_pre_tokenizer(gpt2_tokenizer(), config, TokenizerClass::qwen2);
    FAIL() << "identified";
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find("would not recognise"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Qwen2Tokenizer"), std::string::npos) << e.what();
  }
}

void expect_refused(const json& tokenizer, const json& config, const std::string& why) {
  try {
    check_text_ids(tokenizer, config, TokenizerClass::backend);
    FAIL() << "encoded; expected a refusal naming " << why;
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST_F(PreTokenizer,
       PartsNotEncodedAreRefusedByName) {  // before any encoding: Qwen's pipeline, no vocabulary
  const json qwen = {{"model", {{"type", "BPE"}, {"vocab", json::object()}}},
                     {"added_tokens", (*qwen3_)["added_tokens"]},
                     {"pre_tokenizer", (*qwen3_)["pre_tokenizer"]},
                     {"post_processor", (*qwen3_)["post_processor"]}};
  json t = qwen;
  t["normalizer"] = {{"type", "NFKC"}};
  expect_refused(t, *qwen3_config_, "NFKC");
  t = qwen;
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
  expect_refused(t, *qwen3_config_, "\\\\s+");
  t = qwen;
  t["post_processor"] = {{"type", "RobertaProcessing"}};
  expect_refused(t, *qwen3_config_, "RobertaProcessing");
  t = qwen;
  t["added_tokens"].push_back({{"id", 151700}, {"content", "apple"}});
  expect_refused(t, *qwen3_config_, "apple");
  t = qwen;
  t["truncation"] = {{"max_length", 8}};
  expect_refused(t, *qwen3_config_, "truncation");
}

}  // namespace
}  // namespace ckptfs::views::gguf
