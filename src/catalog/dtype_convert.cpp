#include "catalog/dtype_convert.hpp"

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
[[gnu::always_inline]] inline void convert_each(std::span<const std::byte> src, std::span<std::byte> dst, Fn fn) {
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

bool conversion_supported(DType from, DType to) {
  if (from == to) return true;
  const auto half = [](DType d) { return d == DType::F16 || d == DType::BF16; };
  return (half(from) && to == DType::F32) || (from == DType::F32 && half(to));
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
  assert(false && "unsupported conversion");
}

}  // namespace ckptfs::catalog
