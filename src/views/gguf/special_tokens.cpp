#include "views/gguf/special_tokens.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

using nlohmann::json;

// Python's truth value of a JSON value (None, "", 0, false, [], {} are false).
bool truthy(const json& value) {
  if (value.is_null()) return false;
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0;
  if (value.is_string()) return !value.get_ref<const std::string&>().empty();
  return !value.empty();
}

// What SpecialVocab makes of the post-processor before it reads the special tokens: which of them the
// tokenizer adds, and the tokenizer_config.json entries it fills in or moves for them.
struct SpecialTokenSetup {
  json config;                     // tokenizer_config.json, as the post-processor amended it
  std::vector<std::string> types;  // the kinds read: bos ... mask, and eot, eom where a template moved eos
  Ordered<bool> add;
};

// SpecialVocab's locals: tokenizer_config.json's special tokens as the post-processors amend them.
struct State {
  SpecialTokenSetup setup;
  json bos, cls, eos, sep;
};

// A template piece's piece.get(kind, {}).get("id"): the id of a {"SpecialToken": ...} or {"Sequence": ...}.
json piece_id(const json& piece, const char* kind) {
  if (!piece.is_object()) throw Refusal("tokenizer.json: a TemplateProcessing piece that is not an object");
  const json inner = piece.value(kind, json::object());
  return inner.is_object() ? inner.value("id", json()) : json();
}

json template_list(const json& processor, const char* key) {
  const json list = processor.value(key, json::array());
  if (!list.is_array())
    throw Refusal(fmt::format("tokenizer.json: TemplateProcessing {} is not a list", key));
  return list;
}

// vocab.py's "crude parsing of TemplateProcessing": the single template's leading special token is the bos
// it adds, its trailing one the eos (moving an eos of another name to eot, then eom); the pair template's
// middle token a sep.
void follow_template(const json& processor, State& s) {
  json& tc = s.setup.config;
  const bool has_config = truthy(tc);
  const json single = template_list(processor, "single");
  json pair = template_list(processor, "pair");
  json first, last;
  if (single.size() > 1) {
    first = piece_id(single.front(), "SpecialToken");
    if (truthy(first)) {
      if (!has_config) {
        s.bos = first;
      } else if (first != s.bos && first != s.cls) {
        if (!truthy(s.bos)) tc["bos_token"] = s.bos = first;
        if (!truthy(s.cls)) tc["cls_token"] = s.cls = first;
      }
      s.setup.add.set("bos", first == s.bos || first == s.cls);
    }
    last = piece_id(single.back(), "SpecialToken");
    if (truthy(last)) {
      if (!has_config) {
        s.eos = last;
      } else if (last != s.eos) {
        auto& types = s.setup.types;
        for (const char* kind : {"eot", "eom"})
          if (std::find(types.begin(), types.end(), kind) == types.end()) {
            types.emplace_back(kind);
            tc[std::string(kind) + "_token"] = s.eos;
            break;
          }
        tc["eos_token"] = s.eos = last;
      }
      s.setup.add.set("eos", last == s.eos);
    }
  }
  if (pair.empty()) return;
  const size_t begin = truthy(first) && piece_id(pair.front(), "SpecialToken") == first ? 1 : 0;
  const size_t end =
      truthy(last) && piece_id(pair.back(), "SpecialToken") == last ? pair.size() - 1 : pair.size();
  if (end <= begin) return;
  pair = json(pair.begin() + static_cast<std::ptrdiff_t>(begin),
              pair.begin() + static_cast<std::ptrdiff_t>(end));
  // A [sep] [eos] B
  if (piece_id(pair.front(), "Sequence") != "A" || piece_id(pair.back(), "Sequence") != "B" ||
      pair.size() < 3)
    return;
  const json middle(pair.begin() + 1, pair.end() - 1);
  const auto separates = [&](const json& piece) {
    const json id = piece_id(piece, "SpecialToken");
    return truthy(id) && (id == s.sep || id == s.eos);
  };
  bool add_sep = separates(middle[0]) && !truthy(last);
  if (middle.size() == 2 && separates(middle[1])) add_sep = true;
  s.setup.add.set("sep", add_sep);
  if (add_sep && !truthy(s.sep) && has_config) tc["sep_token"] = s.eos;
}

// `config`: tokenizer_config.json. Throws Refusal for a post-processor other than ByteLevel and
// TemplateProcessing.
SpecialTokenSetup follow_post_processor(const json& tokenizer, json config) {
  State s{{std::move(config), {"bos", "eos", "unk", "sep", "pad", "cls", "mask"}, {}}, {}, {}, {}, {}};
  json& tc = s.setup.config;
  s.bos = tc.value("bos_token", json());
  s.cls = tc.value("cls_token", json());
  s.eos = tc.value("eos_token", json());
  s.sep = tc.value("sep_token", json());
  if (!truthy(s.bos) && truthy(s.cls) && truthy(tc)) tc["bos_token"] = s.bos = s.cls;
  if (!truthy(s.eos) && truthy(s.sep) && truthy(tc)) tc["eos_token"] = s.eos = s.sep;
  const json pp = tokenizer.value("post_processor", json());
  if (!truthy(pp)) return std::move(s.setup);
  if (!pp.is_object()) throw Refusal("tokenizer.json: a post_processor that is not an object");
  const json processors = pp.value("processors", json::array({pp}));
  if (!processors.is_array()) throw Refusal("tokenizer.json: post_processor.processors is not a list");
  for (const auto& p : processors) {
    const json type_field = p.is_object() ? p.value("type", json()) : json();
    const std::string type = type_field.is_string() ? type_field.get<std::string>() : type_field.dump();
    if (type == "ByteLevel") {
      s.setup.add.set_default("bos", false);
      s.setup.add.set_default("eos", false);
    } else if (type == "TemplateProcessing") {
      follow_template(p, s);
    } else {
      throw Refusal(fmt::format("tokenizer.json: post-processor {} not followed by ckptfs yet", type));
    }
  }
  return std::move(s.setup);
}

// The id of added token `content` (a string, or an AddedToken's {"content": ...}): the first match.
json added_token_id(const json& added_tokens, const json& entry) {
  const json content = entry.is_object() ? entry.value("content", json()) : entry;
  if (!content.is_string()) return json();
  for (const auto& a : added_tokens)
    if (a.is_object() && a.value("content", json()) == content) return a.value("id", json());
  return json();
}

}  // namespace

SpecialTokens read_special_tokens(const json& tokenizer, const json& tokenizer_config, const json& config) {
  SpecialTokenSetup setup = follow_post_processor(tokenizer, tokenizer_config);
  const json& tc = setup.config;
  SpecialTokens out{{}, std::move(setup.add), std::nullopt};
  const auto set_id = [&](const std::string& kind, json id) {  // _set_special_token
    if (id.is_boolean()) id = id.get<bool>() ? 1 : 0;          // a Python bool is an int
    if (!id.is_number_integer()) return;
    if (id.get<int64_t>() < 0) throw Refusal(fmt::format("a negative {} token id", kind));
    out.ids.set_default(kind, id.get<uint64_t>());
  };
  if (truthy(tc)) {
    const json chat_template = tc.value("chat_template", json());
    if (chat_template.is_array())
      throw Refusal("tokenizer_config.json: a list of chat templates, which ckptfs does not follow yet");
    if (chat_template.is_string())
      out.chat_template = chat_template.get<std::string>();  // other types: ignored
    const json added = tokenizer.value("added_tokens", json::array());
    for (const auto& kind : setup.types) {
      if (const json add = tc.value("add_" + kind + "_token", json()); add.is_boolean())
        out.add.set_default(kind, add.get<bool>());  // the post-processor's wins
      set_id(kind, added_token_id(added, tc.value(kind + "_token", json())));
    }
  }
  for (const auto& kind : setup.types) {
    json id = config.value(kind + "_token_id", json());
    if (id.is_null() && config.contains("text_config") && config["text_config"].is_object())
      id = config["text_config"].value(kind + "_token_id", json());
    set_id(kind, id);
  }
  return out;
}

}  // namespace ckptfs::views::gguf
