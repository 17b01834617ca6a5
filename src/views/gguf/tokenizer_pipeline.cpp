#include "views/gguf/tokenizer_pipeline.hpp"

#include <fmt/format.h>

#include <optional>
#include <string>

#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

std::string type_of(const json& part) {
  return part.is_object() ? part.value("type", "") : "";
}

std::string shown(const json& part) {
  const std::string s = part.dump();
  return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}

// A token as tokenizer_config.json writes it: a string or an AddedToken object.
std::optional<std::string> content_of(const json& token) {
  const json content = token.is_object() ? token.value("content", json()) : token;
  if (!content.is_string()) return std::nullopt;
  return content.get<std::string>();
}

// The special token `kind` (bos, eos, ...) the loaded tokenizer has: tokenizer_config.json's, else the
// class's default (Qwen2Tokenizer's unk, eos and pad are <|endoftext|>; TokenizersBackend has none).
std::optional<std::string> special_token(const json& config, TokenizerClass tokenizer_class,
                                         const std::string& kind) {
  const std::string key = kind + "_token";
  if (config.contains(key)) return content_of(config[key]);
  if (tokenizer_class == TokenizerClass::qwen2 && (kind == "unk" || kind == "eos" || kind == "pad"))
    return "<|endoftext|>";
  return std::nullopt;
}

// Added and special tokens are matched in the text before the pipeline runs; ckptfs does not split at them.
void check_added_tokens(const json& tokenizer, const json& config, TokenizerClass tokenizer_class,
                        std::string_view text) {
  std::vector<std::optional<std::string>> tokens;
  for (const auto& added : tokenizer.value("added_tokens", json::array()))
    tokens.push_back(content_of(added));
  for (const auto& added : config.value("added_tokens_decoder", json::object()))
    tokens.push_back(content_of(added));
  for (const char* kind : {"bos", "eos", "unk", "sep", "pad", "cls", "mask"})
    tokens.push_back(special_token(config, tokenizer_class, kind));
  for (const char* list : {"additional_special_tokens", "extra_special_tokens"})
    for (const auto& token : config.value(list, json::array())) tokens.push_back(content_of(token));
  for (const auto& token : tokens)
    if (token && !token->empty() && text.find(*token) != std::string_view::npos)
      throw Refusal(fmt::format("the added token {} occurs in the converter's check text", *token));
}

// ignore_merges of the BPE model the class builds.
bool read_model(const json& model, TokenizerClass tokenizer_class) {
  if (type_of(model) != "BPE")
    throw Refusal(fmt::format("tokenizer.json: model {} not encoded", type_of(model)));
  if (tokenizer_class == TokenizerClass::qwen2)
    return false;  // its own BPE of the file's vocabulary and merges
  for (const char* unsupported : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"})
    if (const json v = model.value(unsupported, json()); !v.is_null() && v != json(""))
      throw Refusal(fmt::format("tokenizer.json: BPE {} not encoded by ckptfs yet", unsupported));
  return model.value("ignore_merges", false);
}

void read_pre_tokenizer(const json& pre, TokenizerPipeline& out) {
  const json steps =
      type_of(pre) == "Sequence" ? pre.value("pretokenizers", json::array()) : json::array({pre});
  if (steps.empty() || type_of(steps.back()) != "ByteLevel")
    throw Refusal(
        fmt::format("tokenizer.json: pre-tokenizer {} not encoded by ckptfs yet (one ending in ByteLevel is)",
                    shown(pre)));
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    const json& step = steps[i];
    const json pattern =
        type_of(step) == "Split" ? step.value("pattern", json::object()).value("Regex", json()) : json();
    const auto regex = pattern.is_string() ? split_regex_of(pattern.get<std::string>()) : std::nullopt;
    if (!regex || step.value("behavior", "") != "Isolated" || step.value("invert", false))
      throw Refusal(fmt::format("tokenizer.json: pre-tokenizer {} not encoded by ckptfs yet", shown(step)));
    out.splits.push_back(*regex);
  }
  out.byte_level = {steps.back().value("add_prefix_space", true), steps.back().value("use_regex", true)};
}

// A post-processor of tokenizer.json; a Sequence's processors wrap what the ones before them made.
void read_post_processor(const json& post, TokenizerPipeline& out) {
  const std::string type = type_of(post);
  if (type == "ByteLevel") return;  // it trims offsets, ids stay
  if (type == "Sequence" && !post.value("processors", json::array()).empty()) {
    for (const auto& p : post.at("processors")) read_post_processor(p, out);
    return;
  }
  if (type != "TemplateProcessing")
    throw Refusal(fmt::format("tokenizer.json: post-processor {} not encoded by ckptfs yet", shown(post)));
  std::vector<int64_t> before, after;
  bool text_seen = false;
  for (const auto& item : post.at("single")) {
    if (item.contains("Sequence") && item["Sequence"].value("id", "") == "A" && !text_seen) {
      text_seen = true;
    } else if (item.contains("SpecialToken")) {
      const json& special = post.at("special_tokens").at(item["SpecialToken"].at("id").get<std::string>());
      for (const auto& id : special.at("ids")) (text_seen ? after : before).push_back(id.get<int64_t>());
    } else {
      throw Refusal(
          fmt::format("tokenizer.json: TemplateProcessing item {} not encoded by ckptfs yet", shown(item)));
    }
  }
  if (!text_seen) throw Refusal("tokenizer.json: a TemplateProcessing without $A");
  out.before.insert(out.before.begin(), before.begin(), before.end());
  out.after.insert(out.after.end(), after.begin(), after.end());
}

}  // namespace

TokenizerPipeline read_pipeline(const json& tokenizer, const json& config, TokenizerClass tokenizer_class,
                                std::string_view text) {
  for (const char* key : {"truncation", "padding"})
    if (!tokenizer.value(key, json()).is_null())
      throw Refusal(fmt::format("tokenizer.json: {} set, which changes the ids the converter hashes", key));
  if (config.contains("auto_map"))
    throw Refusal("tokenizer_config.json: auto_map (a tokenizer of the model's code)");
  if (config.value("fix_mistral_regex", json()) == json(true))
    throw Refusal("tokenizer_config.json: fix_mistral_regex (transformers replaces the Split regex)");
  check_added_tokens(tokenizer, config, tokenizer_class, text);
  TokenizerPipeline out;
  out.ignore_merges = read_model(tokenizer.at("model"), tokenizer_class);
  if (tokenizer_class == TokenizerClass::backend) {
    // the check text is in NFC already: an NFC normalizer leaves it as it is
    if (const json normalizer = tokenizer.value("normalizer", json());
        !normalizer.is_null() && type_of(normalizer) != "NFC")
      throw Refusal(
          fmt::format("tokenizer.json: normalizer {} not encoded by ckptfs yet", shown(normalizer)));
    read_pre_tokenizer(tokenizer.value("pre_tokenizer", json()), out);
  } else {  // Qwen2Tokenizer: NFC, Qwen2's Split, ByteLevel with tokenizer_config.json's add_prefix_space
    const json prefix = config.value("add_prefix_space", json());
    if (!prefix.is_null() && !prefix.is_boolean())
      throw Refusal("tokenizer_config.json: add_prefix_space is not a boolean");
    out.splits = {SplitRegex::qwen2};
    out.byte_level = {prefix.is_boolean() && prefix.get<bool>(), false};
  }
  // transformers drops tokenizer_config.json's add_bos_token and add_eos_token where there is a
  // tokenizer.json, and the template it puts in place of a missing post-processor then adds nothing
  if (const json post = tokenizer.value("post_processor", json()); !post.is_null())
    read_post_processor(post, out);
  return out;
}

}  // namespace ckptfs::views::gguf
