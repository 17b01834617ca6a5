#include "views/gguf/gguf_kv.hpp"

#include <algorithm>
#include <bit>

namespace ckptfs::views::gguf {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void put_string(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out += s;
}

namespace {

std::string typed(ValueType type) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(type));
  return out;
}

}  // namespace

void KvList::set(std::string_view key, std::string typed_value) {
  const auto it =
      std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; });
  if (it != entries_.end())
    it->second = std::move(typed_value);
  else
    entries_.emplace_back(std::string(key), std::move(typed_value));
}

void KvList::add_string(std::string_view key, std::string_view value) {
  if (value.empty()) return;  // GGUFWriter.add_string drops empty strings
  std::string v = typed(ValueType::string);
  put_string(v, value);
  set(key, std::move(v));
}

void KvList::add_u32(std::string_view key, uint32_t value) {
  std::string v = typed(ValueType::u32);
  put_u32(v, value);
  set(key, std::move(v));
}

void KvList::add_f32(std::string_view key, double value) {
  std::string v = typed(ValueType::f32);
  put_u32(v, std::bit_cast<uint32_t>(static_cast<float>(value)));
  set(key, std::move(v));
}

void KvList::add_bool(std::string_view key, bool value) {
  std::string v = typed(ValueType::boolean);
  v.push_back(value ? 1 : 0);
  set(key, std::move(v));
}

void KvList::add_strings(std::string_view key, std::span<const std::string> values) {
  if (values.empty()) return;  // GGUFWriter.add_array drops empty arrays
  std::string v = typed(ValueType::array);
  put_u32(v, static_cast<uint32_t>(ValueType::string));
  put_u64(v, values.size());
  for (const auto& s : values) put_string(v, s);
  set(key, std::move(v));
}

void KvList::add_i32s(std::string_view key, std::span<const int32_t> values) {
  if (values.empty()) return;
  std::string v = typed(ValueType::array);
  put_u32(v, static_cast<uint32_t>(ValueType::i32));
  put_u64(v, values.size());
  for (int32_t x : values) put_u32(v, static_cast<uint32_t>(x));
  set(key, std::move(v));
}

std::string KvList::encode() const {
  std::string out;
  for (const auto& [key, value] : entries_) {
    put_string(out, key);
    out += value;
  }
  return out;
}

}  // namespace ckptfs::views::gguf
