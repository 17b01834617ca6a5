#include "pickle/integers.hpp"

#include <vector>

namespace ckptfs::pickle {

std::optional<int64_t> int64_from_twos_complement(std::span<const std::byte> bytes) {
  if (bytes.empty()) return 0;
  const bool negative = (std::to_integer<uint8_t>(bytes.back()) & 0x80) != 0;
  const auto fill = negative ? std::byte{0xff} : std::byte{0};
  // Bytes beyond the eighth must only repeat the sign, and the eighth must carry it.
  for (size_t i = 8; i < bytes.size(); ++i)
    if (bytes[i] != fill) return std::nullopt;
  if (bytes.size() > 8 && ((std::to_integer<uint8_t>(bytes[7]) & 0x80) != 0) != negative) return std::nullopt;
  uint64_t u = negative ? ~uint64_t{0} : 0;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    u &= ~(uint64_t{0xff} << (8 * i));
    u |= uint64_t{std::to_integer<uint8_t>(bytes[i])} << (8 * i);
  }
  return static_cast<int64_t>(u);
}

std::optional<std::variant<int64_t, std::string>> parse_decimal_int(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty() || text.size() > kMaxDecimalDigits) return std::nullopt;
  // Magnitude in base 2^32 limbs, little-endian.
  std::vector<uint32_t> limbs;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t carry = static_cast<uint64_t>(c - '0');
    for (auto& limb : limbs) {
      uint64_t v = uint64_t{limb} * 10 + carry;
      limb = static_cast<uint32_t>(v);
      carry = v >> 32;
    }
    if (carry != 0) limbs.push_back(static_cast<uint32_t>(carry));
  }
  std::string bytes;
  for (uint32_t limb : limbs)
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((limb >> (8 * i)) & 0xff));
  bytes.push_back('\0');  // room for the sign bit
  if (negative) {
    // Two's complement: invert and add one.
    bool carry = true;
    for (auto& b : bytes) {
      auto v = static_cast<uint8_t>(~static_cast<uint8_t>(b));
      if (carry) carry = ++v == 0;
      b = static_cast<char>(v);
    }
  }
  // Minimal form: drop high bytes that only repeat the sign of the byte below them.
  while (bytes.size() > 1) {
    auto top = static_cast<uint8_t>(bytes.back());
    auto below = static_cast<uint8_t>(bytes[bytes.size() - 2]);
    if ((top == 0 && !(below & 0x80)) || (top == 0xff && (below & 0x80))) {
      bytes.pop_back();
    } else {
      break;
    }
  }
  if (auto small = int64_from_twos_complement(std::as_bytes(std::span(bytes)))) return *small;
  return bytes;
}

}  // namespace ckptfs::pickle
