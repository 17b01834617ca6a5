// The index file's primitives, what field_codec.hpp builds every field of: varints, zigzag ints,
// length-prefixed strings, raw doubles. A reader checks every length against what is left and throws
// FormatError on any inconsistency, so a damaged index is reported (and re-parsed), never trusted.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ckptfs/error.hpp"

namespace ckptfs::index {

class ByteWriter {
 public:
  void u64(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void i64(int64_t v) { u64((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void boolean(bool b) { u64(b ? 1 : 0); }
  void real(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(bits >> (8 * i)));
  }
  void text(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  std::string& data() { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}

  uint64_t u64() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= in_.size()) fail("ends inside a number");
      const auto byte = static_cast<uint8_t>(in_[at_++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    fail("a number is too long");
  }
  int64_t i64() {
    const uint64_t z = u64();
    return static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
  }
  bool boolean() { return u64() != 0; }
  double real() {
    if (in_.size() - at_ < 8) fail("ends inside a number");
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits |= static_cast<uint64_t>(static_cast<uint8_t>(in_[at_++])) << (8 * i);
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  std::string text() {
    const uint64_t n = count(1);
    std::string s(in_.substr(at_, n));
    at_ += n;
    return s;
  }
  // A count of items of at least `min_bytes` each: bounded by what is left, so a damaged count cannot
  // make the reader allocate without limit.
  uint64_t count(uint64_t min_bytes) {
    const uint64_t n = u64();
    if (n > (in_.size() - at_) / std::max<uint64_t>(min_bytes, 1)) fail("a count runs past the end");
    return n;
  }
  // An index into a table of `size` entries.
  size_t index(size_t size) {
    const uint64_t i = u64();
    if (i >= size) fail("a reference points outside its table");
    return static_cast<size_t>(i);
  }
  bool done() const { return at_ == in_.size(); }
  size_t remaining() const { return in_.size() - at_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("index: " + what + " (at byte " + std::to_string(at_) + ")");
  }

 private:
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace ckptfs::index
