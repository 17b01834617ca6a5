#include "pickle/builtins.hpp"

#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "pickle/strings.hpp"

namespace ckptfs::pickle {

namespace {

bool is_latin1_name(const Value& v) {
  return v.kind == Kind::String && (v.text == "latin1" || v.text == "latin-1");
}

ValuePtr latin1_bytes(const Value& text, std::string_view callable) {
  auto bytes = utf8_to_latin1(text.text);
  if (!bytes) throw FormatError(fmt::format("{}: text has characters above U+00FF", callable));
  auto v = make_value(Kind::Bytes);
  v->text = std::move(*bytes);
  return v;
}

bool is_sequence(const Value& v) {
  return v.kind == Kind::List || v.kind == Kind::Tuple || v.kind == Kind::Set || v.kind == Kind::FrozenSet;
}

ValuePtr construct_builtins_call(std::string_view name, const std::vector<ValuePtr>& a) {
  if (name == "getattr" && a.size() == 2 && a[0]->kind == Kind::Global && a[1]->kind == Kind::String) {
    // How Python >= 3.11 pickles enum members by name.
    auto v = make_value(Kind::Object);
    v->module = a[0]->module;
    v->name = a[0]->name;
    v->member = a[1]->text;
    return v;
  }
  if ((name == "set" || name == "frozenset") && (a.empty() || (a.size() == 1 && is_sequence(*a[0])))) {
    auto v = make_value(name == "set" ? Kind::Set : Kind::FrozenSet);
    if (!a.empty()) v->items = a[0]->items;
    return v;
  }
  if (name == "bytes" || name == "bytearray") {
    if (a.empty()) return make_value(Kind::Bytes);
    if (a.size() == 1 && a[0]->kind == Kind::Bytes) {
      auto v = make_value(Kind::Bytes);
      v->text = a[0]->text;
      return v;
    }
    // Protocols < 3 pickle bytearray as bytearray(latin1_text, 'latin-1').
    if (name == "bytearray" && a.size() == 2 && a[0]->kind == Kind::String && is_latin1_name(*a[1]))
      return latin1_bytes(*a[0], "bytearray");
  }
  return nullptr;
}

}  // namespace

ValuePtr construct_builtin(const Value& callable, const ValuePtr& args) {
  const auto& a = args->items;
  const std::string& module = callable.module;
  const std::string& name = callable.name;
  if (callable.kind != Kind::Global) return nullptr;
  if (module == "collections" && name == "OrderedDict" && a.empty()) {
    auto v = make_value(Kind::Dict);
    v->module = module;
    v->name = name;
    return v;
  }
  // Protocols < 3 pickle bytes as _codecs.encode(latin1_text, 'latin1').
  if (module == "_codecs" && name == "encode" && a.size() == 2 && a[0]->kind == Kind::String &&
      is_latin1_name(*a[1]))
    return latin1_bytes(*a[0], "_codecs.encode");
  if (is_builtins_module(module)) return construct_builtins_call(name, a);
  // Protocols < 2 build instances of plain classes with copyreg._reconstructor(cls, base, state).
  if ((module == "copy_reg" || module == "copyreg") && name == "_reconstructor" && a.size() == 3 &&
      a[0]->kind == Kind::Global) {
    auto v = make_value(Kind::Object);
    v->module = a[0]->module;
    v->name = a[0]->name;
    v->args = args;
    return v;
  }
  return nullptr;
}

}  // namespace ckptfs::pickle
