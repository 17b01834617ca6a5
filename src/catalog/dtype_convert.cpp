#include "catalog/dtype_convert.hpp"

#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

namespace ckptfs::catalog {

namespace {

float from_bits(uint32_t w) {
  return std::bit_cast<float>(w);
}
uint32_t to_bits(float f) {
  return std::bit_cast<uint32_t>(f);
}

template <typename From, typename To, typename Fn>
[[gnu::always_inline]] inline void convert_each(std::span<const std::byte> src, std::span<std::byte> dst,
                                                Fn fn) {
  const size_t n = src.size() / sizeof(From);
  assert(dst.size() == n * sizeof(To));
  // memcpy per element: the buffers carry no alignment guarantee, and compilers vectorise this loop.
  for (size_t i = 0; i < n; ++i) {
    From in;
    std::memcpy(&in, src.data() + i * sizeof(From), sizeof(From));
    const To out = fn(in);
    std::memcpy(dst.data() + i * sizeof(To), &out, sizeof(To));
  }
}

}  // namespace

// The next two follow c10/util/Half.h (Maratyszcza's FP16 library), which torch uses on every CPU path:
// exact float arithmetic does the rounding, so no branch per exponent range is needed.
float f16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal, inf and NaN: rebias the exponent by scaling (the multiply also quiets a signalling NaN).
  const float normalized = from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: the mantissa placed under 0.5's exponent, minus 0.5.
  const float denormalized = from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  return from_bits(sign | to_bits(two_w < (1u << 27) ? denormalized : normalized));
}

uint16_t f32_to_f16(float f) {
  const uint32_t w = to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  // Scaling up then down rounds to the target precision and turns overflow into inf.
  float base = (std::abs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = to_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float bf16_to_f32(uint16_t b) {
  return from_bits(static_cast<uint32_t>(b) << 16);
}

uint16_t f32_to_bf16(float f) {
  const uint32_t w = to_bits(f);
  // torch's AVX2/AVX-512 conversion (vec256/vec512_bfloat16.h cvtfp32_bf16), which `.to()` takes for
  // every element on x86, writes 0xFFFF for any NaN; its scalar c10::BFloat16 would write 0x7FC0.
  if ((w & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFF;
  return static_cast<uint16_t>((w + 0x7FFFu + ((w >> 16) & 1u)) >> 16);
}

// The float8 kinds as c10 defines them (c10/util/Float8_*.h). E5M2 is the top byte of an IEEE half
// (inf, NaNs with payloads) and torch widens it as that half. E4M3FN has no inf; S.1111.111 is its only
// NaN, widened with its mantissa on top of float's (sign | 0x7FF00000). The FNUZ kinds have no inf, no -0
// and one NaN, 0x80, which torch widens to 0x7F800001 (checked against `.float()`). Every other pattern is
// the number m x 2^(e - bias - mantissa bits), exactly representable in float.
namespace {

struct Float8Format {
  int mantissa_bits;
  int bias;
  bool fnuz;
};

float f8_value(uint8_t b, Float8Format f) {
  const int exponent = (b & 0x7F) >> f.mantissa_bits;
  const int mantissa = b & ((1 << f.mantissa_bits) - 1);
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits)
                              : std::ldexp(static_cast<float>((1 << f.mantissa_bits) | mantissa),
                                           exponent - f.bias - f.mantissa_bits);
  return (b & 0x80) ? -magnitude : magnitude;
}

using Float8Table = std::array<float, 256>;

Float8Table make_f8_table(DType kind) {
  Float8Table t{};
  for (unsigned b = 0; b < 256; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    switch (kind) {
      case DType::F8_E5M2:
        t[b] = f16_to_f32(static_cast<uint16_t>(b << 8));
        break;
      case DType::F8_E4M3FN:
        t[b] =
            (b & 0x7F) == 0x7F ? from_bits(((b & 0x80u) << 24) | 0x7FF00000u) : f8_value(byte, {3, 7, false});
        break;
      case DType::F8_E4M3FNUZ:
        t[b] = b == 0x80 ? from_bits(0x7F800001u) : f8_value(byte, {3, 8, true});
        break;
      case DType::F8_E5M2FNUZ:
        t[b] = b == 0x80 ? from_bits(0x7F800001u) : f8_value(byte, {2, 16, true});
        break;
      default:
        assert(false && "not a float8 kind");
    }
  }
  return t;
}

const Float8Table& f8_table(DType kind) {
  static const Float8Table e5m2 = make_f8_table(DType::F8_E5M2), e4m3fn = make_f8_table(DType::F8_E4M3FN),
                           e4m3fnuz = make_f8_table(DType::F8_E4M3FNUZ),
                           e5m2fnuz = make_f8_table(DType::F8_E5M2FNUZ);
  switch (kind) {
    case DType::F8_E5M2:
      return e5m2;
    case DType::F8_E4M3FN:
      return e4m3fn;
    case DType::F8_E4M3FNUZ:
      return e4m3fnuz;
    default:
      return e5m2fnuz;
  }
}

}  // namespace

bool is_float8(DType d) {
  return d == DType::F8_E5M2 || d == DType::F8_E4M3FN || d == DType::F8_E5M2FNUZ || d == DType::F8_E4M3FNUZ;
}

float f8_to_f32(DType kind, uint8_t b) {
  return f8_table(kind)[b];
}

bool conversion_supported(DType from, DType to) {
  if (from == to) return true;
  const auto half = [](DType d) { return d == DType::F16 || d == DType::BF16; };
  return ((half(from) || is_float8(from)) && to == DType::F32) || (from == DType::F32 && half(to));
}

// Compiled for AVX2 and AVX-512 as well as the baseline x86-64 (SSE2), the best chosen at load time: the
// loops above then convert 8 or 16 elements per instruction instead of 4.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("default", "avx2", "arch=skylake-avx512")))
#endif
void convert(DType from, DType to, std::span<const std::byte> src, std::span<std::byte> dst) {
  if (from == DType::F16 && to == DType::F32) return convert_each<uint16_t, float>(src, dst, f16_to_f32);
  if (from == DType::BF16 && to == DType::F32) return convert_each<uint16_t, float>(src, dst, bf16_to_f32);
  if (from == DType::F32 && to == DType::F16) return convert_each<float, uint16_t>(src, dst, f32_to_f16);
  if (from == DType::F32 && to == DType::BF16) return convert_each<float, uint16_t>(src, dst, f32_to_bf16);
  if (is_float8(from) && to == DType::F32) {
    const Float8Table& table = f8_table(from);
    return convert_each<uint8_t, float>(src, dst, [&](uint8_t b) { return table[b]; });
  }
  assert(false && "unsupported conversion");
}

}  // namespace ckptfs::catalog
