#include "formats/dcp/nested_state.hpp"

#include <fmt/format.h>

#include "ckptfs/error.hpp"

namespace ckptfs::dcp {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

constexpr int64_t kMaxListIndex = 1 << 24;

std::string key_text(const pickle::Value& key) {
  return key.is(Kind::Int) ? fmt::format("#{}", key.integer) : key.text;
}

}  // namespace

NestedState::NestedState() : root_(pickle::make_value(Kind::Dict)) {}

ValuePtr& NestedState::slot(const ValuePtr& container, const pickle::Value& key) {
  if (container->is(Kind::List)) {
    if (!key.is(Kind::Int) || key.integer < 0 || key.integer > kMaxListIndex)
      throw FormatError(fmt::format("list index {} out of range", key_text(key)));
    auto& items = container->items;
    while (items.size() <= static_cast<size_t>(key.integer)) items.push_back(pickle::make_value(Kind::None));
    return items[static_cast<size_t>(key.integer)];
  }
  if (!container->is(Kind::Dict))
    throw FormatError(fmt::format("key {} below a value that is not a container", key_text(key)));
  auto& positions = index_[container.get()];
  auto [it, inserted] = positions.try_emplace(key_text(key), container->entries.size());
  if (inserted) {
    auto k = pickle::make_value(key.kind);
    k->integer = key.integer;
    k->text = key.text;
    container->entries.emplace_back(std::move(k), pickle::make_value(Kind::None));
  }
  return container->entries[it->second].second;
}

void NestedState::set(const std::vector<ValuePtr>& path, ValuePtr value) {
  if (path.empty()) throw FormatError("empty key path");
  ValuePtr container = root_;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    ValuePtr& child = slot(container, *path[i]);
    if (child->is(Kind::None))
      child = pickle::make_value(path[i + 1]->is(Kind::Int) ? Kind::List : Kind::Dict);
    container = child;
  }
  slot(container, *path.back()) = std::move(value);
}

}  // namespace ckptfs::dcp
