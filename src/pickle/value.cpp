#include <utility>
#include <vector>

#include "ckptfs/overloaded.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::pickle {

namespace {

void move_children(Value& v, std::vector<ValuePtr>& out) {
  for (auto& item : v.items) out.push_back(std::move(item));
  for (auto& [key, value] : v.entries) {
    out.push_back(std::move(key));
    out.push_back(std::move(value));
  }
  v.items.clear();
  v.entries.clear();
  out.push_back(std::move(v.args));
  out.push_back(std::move(v.state));
  out.push_back(std::move(v.kwargs));
}

const Value* find_entry(const Value& dict, std::string_view key) {
  for (auto it = dict.entries.rbegin(); it != dict.entries.rend(); ++it) {
    if (it->first && it->first->kind == Kind::String && it->first->text == key) return it->second.get();
  }
  return nullptr;
}

}  // namespace

Value::~Value() {
  if (items.empty() && entries.empty() && !args && !state && !kwargs) return;
  std::vector<ValuePtr> pending;
  move_children(*this, pending);
  while (!pending.empty()) {
    ValuePtr child = std::move(pending.back());
    pending.pop_back();
    // Sole owner: take its children first so that its own destructor has nothing left to recurse into.
    if (child && child.use_count() == 1) move_children(*child, pending);
  }
}

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::Dict && kind != Kind::Object) return nullptr;
  if (const Value* found = find_entry(*this, key)) return found;
  if (kind != Kind::Object || !state) return nullptr;
  if (state->kind == Kind::Dict) return find_entry(*state, key);
  // Objects with __slots__ pickle their state as (dict or None, slots dict).
  if (state->kind == Kind::Tuple && state->items.size() == 2) {
    for (const auto& part : state->items) {
      if (part && part->kind == Kind::Dict) {
        if (const Value* found = find_entry(*part, key)) return found;
      }
    }
  }
  return nullptr;
}

std::string Value::describe() const {
  switch (kind) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
    case Kind::BigInt:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tuple:
      return "tuple";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return module.empty() ? "dict" : module + "." + name;
    case Kind::Set:
      return "set";
    case Kind::FrozenSet:
      return "frozenset";
    case Kind::Global:
      return module + "." + name;
    case Kind::Object:
      return member.empty() ? module + "." + name : module + "." + name + "." + member;
    case Kind::Native:
      if (!native) return "native value";
      return std::visit(Overloaded{
                            [](const std::shared_ptr<const torch::StorageRef>&) { return "storage"; },
                            [](const std::shared_ptr<const torch::TensorObject>&) { return "tensor"; },
                            [](const std::shared_ptr<const catalog::TensorValue>&) { return "tensor"; },
                        },
                        *native);
  }
  return "unknown";
}

}  // namespace ckptfs::pickle
