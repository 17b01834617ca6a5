#include "views/gguf/gguf_numbers.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace ckptfs::views::gguf {

uint16_t f32_to_f16(uint32_t f) {
  const uint32_t sign = (f >> 16) & 0x8000, exp = f & 0x7f800000;
  uint32_t mant = f & 0x007fffff;
  if (exp >= 0x47800000) {  // overflow to inf, inf, NaN
    if (exp == 0x7f800000 && mant != 0) {
      const uint32_t nan = 0x7c00 + (mant >> 13);
      return static_cast<uint16_t>(sign |
                                   (nan == 0x7c00 ? 0x7c01 : nan));  // a payload lost below bit 13 stays NaN
    }
    return static_cast<uint16_t>(sign | 0x7c00);
  }
  if (exp <= 0x38000000) {  // a half subnormal, or zero
    if (exp < 0x33000000) return static_cast<uint16_t>(sign);
    uint32_t shifted = (0x00800000 | mant) >> (113 - (exp >> 23));
    // round to nearest even, counting the bits the shift dropped
    if ((shifted & 0x3fff) != 0x1000 || (f & 0x7ff) != 0) shifted += 0x1000;
    return static_cast<uint16_t>(sign + (shifted >> 13));
  }
  if ((mant & 0x3fff) != 0x1000) mant += 0x1000;  // round to nearest even; a carry rolls into the exponent
  return static_cast<uint16_t>(sign + ((exp - 0x38000000) >> 13) + (mant >> 13));
}

uint32_t f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exp = h & 0x7c00u, mant = h & 0x03ffu;
  if (exp == 0x7c00u) return sign | 0x7f800000u | mant << 13;  // inf, NaN
  if (exp != 0) return sign | ((h & 0x7fffu) + 0x1c000u) << 13;
  if (mant == 0) return sign;
  // a subnormal: normalized, its exponent lowered by each shift
  const int shift = std::countl_zero(static_cast<uint16_t>(mant << 6));  // leading zeros within the 10 bits
  return sign | uint32_t(112 - shift) << 23 | ((mant << (shift + 1)) & 0x03ffu) << 13;
}

uint16_t f32_to_bf16(uint32_t u) {
  if ((u & 0x7fffffff) > 0x7f800000) u = (u & 0xffff0000) | 0x00400000;
  return static_cast<uint16_t>((uint64_t{u} + 0x7fff + ((u >> 16) & 1)) >> 16);
}

void quantize_q8_0_block(std::span<const float, kQ8Block> x, std::span<uint8_t, kQ8BlockBytes> out) {
  // numpy's max of |x|, which propagates a NaN. Over the bits with the sign cleared, which order as the
  // magnitudes do and put every NaN above infinity: an integer max, which the compiler vectorizes.
  uint32_t max_bits = 0;
  for (float v : x) max_bits = std::max(max_bits, std::bit_cast<uint32_t>(v) & 0x7fffffffu);
  const float amax =
      max_bits > 0x7f800000u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(max_bits);
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  const uint16_t scale = f32_to_f16(std::bit_cast<uint32_t>(d));
  out[0] = static_cast<uint8_t>(scale);
  out[1] = static_cast<uint8_t>(scale >> 8);
  if (std::isfinite(amax) && std::isfinite(id)) {
    // |x * id| <= 127 here: round half away from zero (gguf-py's np_roundf) by truncation and the exact
    // remainder, which vectorizes where std::round is a call per element
    for (size_t j = 0; j < kQ8Block; ++j) {
      const float y = x[j] * id;
      const auto t = static_cast<int32_t>(y);
      const float rest = y - static_cast<float>(t);
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(t + (rest >= 0.5f) - (rest <= -0.5f)));
    }
    return;
  }
  for (size_t j = 0; j < kQ8Block; ++j) {
    const float q = std::round(x[j] * id);
    // numpy's cast of NaN or inf to int8 gives 0 on x86, as the converter's files show
    out[2 + j] = static_cast<uint8_t>(std::isfinite(q) ? static_cast<int8_t>(q) : 0);
  }
}

}  // namespace ckptfs::views::gguf
