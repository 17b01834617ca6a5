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

uint16_t f32_to_bf16(uint32_t u) {
  if ((u & 0x7fffffff) > 0x7f800000) u = (u & 0xffff0000) | 0x00400000;
  return static_cast<uint16_t>((uint64_t{u} + 0x7fff + ((u >> 16) & 1)) >> 16);
}

void quantize_q8_0_block(std::span<const float, kQ8Block> x, std::span<uint8_t, kQ8BlockBytes> out) {
  // numpy's max of |x| propagates a NaN
  float amax = 0.0f;
  bool nan = false;
  for (float v : x) {
    nan = nan || std::isnan(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (nan) amax = std::numeric_limits<float>::quiet_NaN();
  const float d = amax / 127.0f;
  const float id = d == 0.0f ? 0.0f : 1.0f / d;
  const uint16_t scale = f32_to_f16(std::bit_cast<uint32_t>(d));
  out[0] = static_cast<uint8_t>(scale);
  out[1] = static_cast<uint8_t>(scale >> 8);
  for (size_t j = 0; j < kQ8Block; ++j) {
    const float q = std::round(x[j] * id);  // half away from zero, as gguf-py's np_roundf
    // numpy's cast of NaN or inf to int8 gives 0 on x86, as the converter's files show
    out[2 + j] = static_cast<uint8_t>(std::isfinite(q) ? static_cast<int8_t>(q) : 0);
  }
}

}  // namespace ckptfs::views::gguf
