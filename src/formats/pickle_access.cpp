#include "formats/pickle_access.hpp"

#include <fmt/format.h>

#include <array>

#include "ckptfs/error.hpp"

namespace ckptfs::formats {

using pickle::Kind;

namespace {

std::string join(const std::string& base, std::string_view key) {
  return base.empty() ? std::string(key) : fmt::format("{}.{}", base, key);
}

}  // namespace

void Field::fail(std::string_view problem) const {
  throw FormatError(fmt::format("{}: {}: {}", file_->string(), path_.empty() ? "<root>" : path_, problem));
}

const pickle::Value& Field::value() const {
  if (value_ == nullptr) fail("missing");
  return *value_;
}

Field Field::operator[](std::string_view key) const {
  const pickle::Value* child = nullptr;
  if (value_ != nullptr && (value_->kind == Kind::Dict || value_->kind == Kind::Object))
    child = value_->find(key);
  return Field(child, file_, join(path_, key));
}

Field Field::at(size_t index) const {
  const auto& v = value();
  if (v.kind != Kind::List && v.kind != Kind::Tuple)
    fail(fmt::format("expected a list, found {}", v.describe()));
  if (index >= v.items.size()) fail(fmt::format("has {} items, item {} is missing", v.items.size(), index));
  return Field(v.items[index].get(), file_, fmt::format("{}[{}]", path_, index));
}

size_t Field::size() const {
  const auto& v = value();
  if (v.kind == Kind::List || v.kind == Kind::Tuple) return v.items.size();
  if (v.kind == Kind::Dict) return v.entries.size();
  fail(fmt::format("expected a list or dict, found {}", v.describe()));
}

bool Field::is_list() const {
  return value_ != nullptr && (value_->kind == Kind::List || value_->kind == Kind::Tuple);
}

bool Field::is_dict() const {
  return value_ != nullptr && value_->kind == Kind::Dict;
}

int64_t Field::as_int() const {
  const auto& v = value();
  if (v.kind == Kind::Int) return v.integer;
  if (v.kind == Kind::Bool) return v.boolean ? 1 : 0;
  fail(fmt::format("expected an int, found {}", v.describe()));
}

std::string Field::as_string() const {
  const auto& v = value();
  if (v.kind != Kind::String) fail(fmt::format("expected a string, found {}", v.describe()));
  return v.text;
}

std::vector<int64_t> Field::as_shape() const {
  const auto& v = value();
  const pickle::Value* seq = &v;
  // torch.Size is turned into a tuple by the torch reader; an unknown Size-like object keeps its args.
  if (v.kind == Kind::Object && v.args && v.args->kind == Kind::Tuple && v.args->items.size() == 1)
    seq = v.args->items[0].get();
  if (seq->kind != Kind::Tuple && seq->kind != Kind::List)
    fail(fmt::format("expected a shape, found {}", v.describe()));
  std::vector<int64_t> shape;
  for (const auto& item : seq->items) {
    if (item->kind != Kind::Int || item->integer < 0) fail("shape holds a value that is not a size");
    shape.push_back(item->integer);
  }
  return shape;
}

const torch::SourceTensor& Field::as_tensor() const {
  const auto* t = torch::as_tensor(value());
  if (t == nullptr) fail(fmt::format("expected a tensor, found {}", value().describe()));
  return *t;
}

int64_t Field::as_enum_int() const {
  const auto& v = value();
  if (v.kind == Kind::Int) return v.integer;
  if (v.kind == Kind::Object) {
    if (!v.member.empty()) {
      // ZeroStageEnum members pickled by name (Python >= 3.11).
      static constexpr std::array<std::pair<std::string_view, int64_t>, 5> kStages{
          {{"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}}};
      for (const auto& [name, stage] : kStages)
        if (v.member == name) return stage;
      fail(fmt::format("unknown enum member {}.{}", v.name, v.member));
    }
    if (v.args && v.args->kind == Kind::Tuple && v.args->items.size() == 1 &&
        v.args->items[0]->kind == Kind::Int)
      return v.args->items[0]->integer;
  }
  fail(fmt::format("expected an enum or int, found {}", v.describe()));
}

std::vector<std::pair<std::string, Field>> Field::items() const {
  const auto& v = value();
  if (v.kind != Kind::Dict) fail(fmt::format("expected a dict, found {}", v.describe()));
  std::vector<std::pair<std::string, Field>> out;
  for (const auto& [key, val] : v.entries) {
    if (key->kind != Kind::String) fail(fmt::format("has a key of type {}, expected names", key->describe()));
    out.emplace_back(key->text, Field(val.get(), file_, join(path_, key->text)));
  }
  return out;
}

}  // namespace ckptfs::formats
