#include "views/gguf/pre_tokenizer.hpp"

#include <fmt/format.h>

#include <map>

#include "views/gguf/bpe_encoder.hpp"
#include "views/gguf/hf_directory.hpp"
#include "views/gguf/sha256.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

// The converter's check text (conversion/base.py, chktxt). It is in NFC.
constexpr std::string_view kCheckText =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\xe2\x80\x8d"
    "🌫\xef\xb8\x8f"
    " (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make "
    "it, "
    "'D you like some tea? We'Ve a'lL";

// The converter's names of the hashes of the families ckptfs encodes (each hash appears once in its chain of
// ifs).
const std::map<std::string, std::string, std::less<>> kKnownHashes = {
    {"3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"},  // GPT-2
    {"0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5",
     "llama-bpe"},  // Llama 3, BOS template
    {"c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d",
     "smaug-bpe"},                                                                  // Llama 3, first revision
    {"e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2"},  // Qwen1.5/2/2.5/3
    {"d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2"},  // Qwen3-Embedding
};

// The pieces the pipeline's pre-tokenizers cut the text into, as bytes, before ByteLevel maps them to
// symbols.
std::vector<std::string> pre_tokens(const TokenizerPipeline& pipeline) {
  std::vector<std::string> pieces = {std::string(kCheckText)};
  const auto split_each = [&pieces](SplitRegex regex) {
    std::vector<std::string> out;
    for (const auto& piece : pieces)
      for (auto& p : split_text(piece, regex)) out.push_back(std::move(p));
    pieces = std::move(out);
  };
  for (const SplitRegex regex : pipeline.splits) split_each(regex);
  if (pipeline.byte_level.add_prefix_space)
    for (auto& piece : pieces)
      if (!piece.starts_with(' ')) piece = ' ' + piece;
  if (pipeline.byte_level.use_regex) split_each(SplitRegex::gpt2);
  return pieces;
}

}  // namespace

std::vector<int64_t> check_text_ids(const json& tokenizer, const json& tokenizer_config,
                                    TokenizerClass tokenizer_class) {
  try {
    const TokenizerPipeline pipeline =
        read_pipeline(tokenizer, tokenizer_config, tokenizer_class, kCheckText);
    const auto pieces = pre_tokens(pipeline);
    const BpeEncoder bpe(tokenizer.at("model"), pipeline.ignore_merges, pieces);
    std::vector<int64_t> ids = pipeline.before;
    for (const auto& piece : pieces) bpe.encode(piece, ids);
    ids.insert(ids.end(), pipeline.after.begin(), pipeline.after.end());
    return ids;
  } catch (const json::exception& e) {
    throw Refusal(fmt::format("tokenizer.json or tokenizer_config.json: {}", e.what()));
  }
}

std::string identify_pre_tokenizer(const json& tokenizer, const json& tokenizer_config,
                                   TokenizerClass tokenizer_class) {
  const auto ids = check_text_ids(tokenizer, tokenizer_config, tokenizer_class);
  std::string printed = "[";  // Python's str(list)
  for (size_t i = 0; i < ids.size(); ++i) printed += fmt::format("{}{}", i ? ", " : "", ids[i]);
  printed += "]";
  const std::string hash = sha256_hex(printed);
  if (const auto it = kKnownHashes.find(hash); it != kKnownHashes.end()) return it->second;
  throw Refusal(
      fmt::format("the converter would not recognise this BPE pre-tokenizer (check text encoded as "
                  "transformers' {} does, "
                  "hash {}): -o gguf_pre=NAME names it",
                  tokenizer_class == TokenizerClass::qwen2 ? "Qwen2Tokenizer" : "TokenizersBackend", hash));
}

}  // namespace ckptfs::views::gguf
