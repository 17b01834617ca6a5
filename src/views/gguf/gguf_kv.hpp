// The key-value section of a GGUF file as gguf-py's GGUFWriter writes it: keys in the order first added
// (adding a key again replaces its value in place), empty strings and arrays left out, little-endian.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::views::gguf {

// GGUF's value types (ggml docs/gguf.md, gguf-py constants.py GGUFValueType).
enum class ValueType : uint32_t { u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9 };

// Appends GGUF's string: u64 byte length, then the bytes.
void put_string(std::string& out, std::string_view s);
void put_u32(std::string& out, uint32_t v);
void put_u64(std::string& out, uint64_t v);

class KvList {
 public:
  void add_string(std::string_view key, std::string_view value);
  void add_u32(std::string_view key, uint32_t value);
  // A JSON number as Python packs it into a FLOAT32: the double rounded to the nearest float.
  void add_f32(std::string_view key, double value);
  void add_bool(std::string_view key, bool value);
  void add_strings(std::string_view key, std::span<const std::string> values);
  void add_i32s(std::string_view key, std::span<const int32_t> values);

  size_t size() const { return entries_.size(); }
  // Every entry: key, value type, value.
  std::string encode() const;

 private:
  void set(std::string_view key, std::string typed_value);
  std::vector<std::pair<std::string, std::string>> entries_;  // key, type + value bytes
};

}  // namespace ckptfs::views::gguf
