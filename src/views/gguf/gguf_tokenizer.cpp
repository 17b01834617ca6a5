#include "views/gguf/gguf_tokenizer.hpp"

#include <fmt/format.h>

#include <array>
#include <optional>
#include <vector>

#include "views/gguf/special_tokens.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

// gguf-py's TokenType
enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

// Files that send the converter down another path, or change what AutoTokenizer loads, which ckptfs does
// not follow yet.
constexpr std::array kUnfollowedFiles = {
    "tokenizer.model",     "added_tokens.json",  "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json", "tekken.json",
    "merges.txt"};

// The converter's does_token_look_special (conversion/base.py).
bool looks_special(const std::string& t) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.starts_with(open) && t.ends_with(close);
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>") || wrapped("<unused", ">");
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// tokenizer.json's model.merges: "a b" strings as they are; [a, b] pairs (tokenizers >= 0.20) joined with a
// space, a space inside a part written U+0120 (gguf-py vocab.py).
std::vector<std::string> merges_of(const json& merges) {
  std::vector<std::string> out;
  if (!merges.is_array()) return out;
  out.reserve(merges.size());
  for (const auto& m : merges) {
    if (m.is_string()) {
      out.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.push_back(replace_all(m[0].get<std::string>(), " ", "\xc4\xa0") + " " +
                    replace_all(m[1].get<std::string>(), " ", "\xc4\xa0"));
    } else {
      throw Refusal("tokenizer.json: model.merges in an unknown format");
    }
  }
  return out;
}

// SpecialVocab's normalizer flags (vocab.py _parse_normalizer).
struct NormalizerFlags {
  std::optional<bool> nfc, lowercase, strip_accents;
};
void parse_normalizer(const json& n, NormalizerFlags& flags) {
  if (!n.is_object()) return;
  const std::string type = n.value("type", "");
  if (type == "Lowercase") flags.lowercase = true;
  if (type == "NFC") flags.nfc = true;
  if (type == "StripAccents") flags.strip_accents = true;
  if (type == "BertNormalizer") {
    if (n.contains("lowercase") && n["lowercase"].is_boolean()) flags.lowercase = n["lowercase"].get<bool>();
    if (n.contains("strip_accents") && n["strip_accents"].is_boolean())
      flags.strip_accents = n["strip_accents"].get<bool>();
  }
  if (type == "Sequence") {
    const json inner = n.value("normalizers", json::array());
    for (const auto& each : inner) parse_normalizer(each, flags);
  }
}

}  // namespace

void add_bpe_tokenizer(KvList& kv, const HfDirectory& dir, const json& tokenizer_json, const json& config,
                       const std::string& pre) {
  for (const char* name : kUnfollowedFiles)
    if (dir.has(name)) throw Refusal(fmt::format("{} present: ckptfs follows tokenizer.json alone", name));
  const json* tokenizer = &tokenizer_json;
  const json tokenizer_config = dir.json("tokenizer_config.json").value_or(json::object());
  const json model = tokenizer->value("model", json::object());
  if (model.value("type", "") != "BPE") throw Refusal("tokenizer.json: not a BPE model");
  if (model.value("byte_fallback", false))
    throw Refusal("tokenizer.json: a byte-fallback BPE (Llama 2 style) vocabulary");
  if (!config.contains("vocab_size") || !config["vocab_size"].is_number_unsigned())
    throw Refusal("config.json: no vocab_size");
  const uint64_t vocab_size = config["vocab_size"].get<uint64_t>();
  if (vocab_size > (uint64_t{1} << 24)) throw Refusal("config.json: vocab_size over 2^24");

  // AutoTokenizer's vocab: the model's, then the added tokens; every id below config.json's vocab_size
  std::vector<std::optional<std::string>> tokens(vocab_size);
  std::vector<int32_t> types(vocab_size, kUnused);
  const auto place = [&](const std::string& token, const json& id_value) -> uint64_t {
    if (!id_value.is_number_unsigned() || id_value.get<uint64_t>() >= vocab_size)
      throw Refusal(
          fmt::format("tokenizer.json: token {} has an id outside config.json's vocab_size", token));
    const uint64_t id = id_value.get<uint64_t>();
    if (tokens[id] && *tokens[id] != token)
      throw Refusal(fmt::format("tokenizer.json: id {} names two tokens", id));
    tokens[id] = token;
    return id;
  };
  const json vocab = model.value("vocab", json::object());
  for (const auto& [token, id] : vocab.items()) types[place(token, id)] = kNormal;
  const json added = tokenizer->value("added_tokens", json::array());
  for (const auto& a : added) {
    const std::string content = a.value("content", "");
    const uint64_t id = place(content, a.value("id", json()));
    // a non-normalized added token is round-tripped through the tokenizer by the converter: the identity for
    // the special tokens of the byte-level families
    if (a.value("special", false) || looks_special(content)) {
      types[id] = kControl;
    } else {
      tokens[id] = replace_all(content, "\xe2\x96\x81", " ");
      types[id] = kUserDefined;
    }
  }
  std::vector<std::string> token_list;
  token_list.reserve(vocab_size);
  for (uint64_t i = 0; i < vocab_size; ++i)
    token_list.push_back(tokens[i] ? *tokens[i] : fmt::format("[PAD{}]", i));

  kv.add_string("tokenizer.ggml.model", "gpt2");
  kv.add_string("tokenizer.ggml.pre", pre);
  kv.add_strings("tokenizer.ggml.tokens", token_list);
  kv.add_i32s("tokenizer.ggml.token_type", types);

  // gguf-py's SpecialVocab(load_merges=True)
  kv.add_strings("tokenizer.ggml.merges", merges_of(model.value("merges", json())));
  const SpecialTokens special = read_special_tokens(*tokenizer, tokenizer_config, config);
  const std::map<std::string, std::string> id_keys = {
      {"bos", "bos_token_id"},       {"eos", "eos_token_id"},     {"unk", "unknown_token_id"},
      {"sep", "seperator_token_id"}, {"pad", "padding_token_id"}, {"mask", "mask_token_id"},
      {"eot", "eot_token_id"},       {"eom", "eom_token_id"}};  // (sic: gguf-py's)
  for (const auto& [kind, id] : special.ids.items)
    if (const auto it = id_keys.find(kind); it != id_keys.end()) {
      if (id > UINT32_MAX) throw Refusal(fmt::format("{} token id {} over 2^32", kind, id));
      kv.add_u32("tokenizer.ggml." + it->second, static_cast<uint32_t>(id));
    }
  for (const auto& [kind, value] : special.add.items)
    if (kind == "bos" || kind == "eos" || kind == "sep")
      kv.add_bool("tokenizer.ggml.add_" + kind + "_token", value);
  if (special.chat_template) kv.add_string("tokenizer.chat_template", *special.chat_template);
  NormalizerFlags flags;
  parse_normalizer(tokenizer->value("normalizer", json()), flags);
  if (flags.nfc) kv.add_bool("tokenizer.ggml.normalizer.nfc", *flags.nfc);
  if (flags.lowercase) kv.add_bool("tokenizer.ggml.normalizer.lowercase", *flags.lowercase);
  if (flags.strip_accents) kv.add_bool("tokenizer.ggml.normalizer.strip_accents", *flags.strip_accents);
}

}  // namespace ckptfs::views::gguf
