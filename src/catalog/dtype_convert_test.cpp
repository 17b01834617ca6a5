// Conversions against an integer-only reference and against values torch 1.13's `.to()` produced.
#include "catalog/dtype_convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "catalog/test_sources.hpp"

namespace ckptfs::catalog {
namespace {

namespace ref = testing::reference;

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
float from_bits(uint32_t w) {
  return std::bit_cast<float>(w);
}

TEST(Convert, WideningIsExactForEvery16BitPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    ASSERT_EQ(bits(f16_to_f32(static_cast<uint16_t>(h))), ref::f16_to_f32(static_cast<uint16_t>(h)))
        << std::hex << h;
    ASSERT_EQ(bits(bf16_to_f32(static_cast<uint16_t>(h))), ref::bf16_to_f32(static_cast<uint16_t>(h)))
        << std::hex << h;
  }
}

TEST(Convert, NarrowingMatchesReferenceAroundEveryRoundingPoint) {
  // Every sign/exponent/upper-mantissa combination with low bits at and around both halfway points
  // (bit 12 for f16 normals, bit 15 for bf16), plus a sweep of the whole 32-bit space.
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF,
                           0x2000, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  std::vector<uint32_t> inputs;
  for (uint32_t high = 0; high <= 0xFFFF; ++high)
    for (uint32_t low : lows) inputs.push_back(high << 16 | low);
  for (uint64_t w = 0; w <= 0xFFFFFFFFu; w += 4099) inputs.push_back(static_cast<uint32_t>(w));
  for (uint32_t w : inputs) {
    ASSERT_EQ(f32_to_f16(from_bits(w)), ref::f32_to_f16(w)) << std::hex << w;
    ASSERT_EQ(f32_to_bf16(from_bits(w)), ref::f32_to_bf16(w)) << std::hex << w;
  }
}

TEST(Convert, F16SubnormalsAndOverflow) {
  for (uint32_t e = 100; e < 114; ++e)  // every f32 exponent that lands in f16's subnormal range
    for (uint32_t m = 0; m < (1u << 23); m += 61)
      ASSERT_EQ(f32_to_f16(from_bits(e << 23 | m)), ref::f32_to_f16(e << 23 | m))
          << std::hex << (e << 23 | m);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);    // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);    // tie to even: 0
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // tie to even: 2
  EXPECT_EQ(f32_to_f16(-0x1.8p-25f), 0x8001);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie rounds up to inf
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(Convert, ValuesTorchProduced) {
  // torch 1.13: torch.tensor(...).to(float16 / bfloat16).view(int16) for these float32 bit patterns.
  const uint32_t in[] = {0x3f808000, 0x3f818000, 0x7f7fffff, 0x33000000,
                         0x33000001, 0x387fe000, 0x477ff000, 0x477fefff};
  const uint16_t f16[] = {15364, 15372, 31744, 0, 1, 1024, 31744, 31743};
  const uint16_t bf16[] = {16256, 16258, 32640, 13056, 13056, 14464, 18304, 18304};
  for (size_t i = 0; i < std::size(in); ++i) {
    EXPECT_EQ(f32_to_f16(from_bits(in[i])), f16[i]) << std::hex << in[i];
    EXPECT_EQ(f32_to_bf16(from_bits(in[i])), bf16[i]) << std::hex << in[i];
  }
  // NaN: f16 keeps only the sign, bf16 is 0xFFFF on torch's vectorised CPU path; widening quiets f16 NaNs
  // and keeps bf16 bits as they are.
  for (uint32_t nan : {0x7fc00000u, 0xffc00001u, 0x7f812345u, 0x7fffffffu}) {
    EXPECT_EQ(f32_to_f16(from_bits(nan)), (nan >> 16 & 0x8000) | 0x7E00) << std::hex << nan;
    EXPECT_EQ(f32_to_bf16(from_bits(nan)), 0xFFFF) << std::hex << nan;
  }
  EXPECT_EQ(bits(f16_to_f32(0x7c01)), 0x7fc02000u);
  EXPECT_EQ(bits(f16_to_f32(0xfe00)), 0xffc00000u);
  EXPECT_EQ(bits(f16_to_f32(0x7fff)), 0x7fffe000u);
  EXPECT_EQ(bits(f16_to_f32(0x0001)), 0x33800000u);
  EXPECT_EQ(bits(bf16_to_f32(0x7f81)), 0x7f810000u);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
}

TEST(Convert, BufferConversionAndSupportedPairs) {
  std::mt19937 rng(3);
  std::vector<uint32_t> in(1001);
  for (auto& w : in) w = rng();
  std::vector<uint16_t> half(in.size());
  convert(DType::F32, DType::BF16, std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(half)));
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(half[i], ref::f32_to_bf16(in[i]));
  convert(DType::F32, DType::F16, std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(half)));
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(half[i], ref::f32_to_f16(in[i]));
  std::vector<uint32_t> wide(half.size());
  convert(DType::F16, DType::F32, std::as_bytes(std::span(half)), std::as_writable_bytes(std::span(wide)));
  for (size_t i = 0; i < half.size(); ++i) ASSERT_EQ(wide[i], ref::f16_to_f32(half[i]));
  convert(DType::BF16, DType::F32, std::as_bytes(std::span(half)), std::as_writable_bytes(std::span(wide)));
  for (size_t i = 0; i < half.size(); ++i) ASSERT_EQ(wide[i], ref::bf16_to_f32(half[i]));

  EXPECT_TRUE(conversion_supported(DType::I64, DType::I64));
  EXPECT_TRUE(conversion_supported(DType::BF16, DType::F32));
  EXPECT_TRUE(conversion_supported(DType::F32, DType::F16));
  EXPECT_FALSE(conversion_supported(DType::F16, DType::BF16));
  EXPECT_FALSE(conversion_supported(DType::F64, DType::F32));
  EXPECT_FALSE(conversion_supported(DType::I32, DType::F32));
  EXPECT_TRUE(conversion_supported(DType::F8_E4M3FNUZ, DType::F32));
  EXPECT_FALSE(conversion_supported(DType::F32, DType::F8_E4M3FN));
}

// Float8 against the formats' definitions (OCP FP8 and the FNUZ papers): largest normals, smallest
// subnormals, one, zeros, and the special patterns (torch's own `.float()` is compared with all 256
// patterns of each kind by mount_tests/test_dcp.py::test_float8_upcast_matches_torch).
TEST(Convert, Float8WidensToTheValuesTheFormatsDefine) {
  struct Case {
    DType kind;
    uint8_t bits;
    float value;
  };
  const Case cases[] = {
      {DType::F8_E4M3FN, 0x38, 1.0f},       {DType::F8_E4M3FN, 0x7E, 448.0f},
      {DType::F8_E4M3FN, 0x01, 0x1p-9f},    {DType::F8_E4M3FN, 0xFE, -448.0f},
      {DType::F8_E5M2, 0x3C, 1.0f},         {DType::F8_E5M2, 0x7B, 57344.0f},
      {DType::F8_E5M2, 0x01, 0x1p-16f},     {DType::F8_E4M3FNUZ, 0x40, 1.0f},
      {DType::F8_E4M3FNUZ, 0x7F, 240.0f},   {DType::F8_E4M3FNUZ, 0x01, 0x1p-10f},
      {DType::F8_E4M3FNUZ, 0xFF, -240.0f},  {DType::F8_E5M2FNUZ, 0x40, 1.0f},
      {DType::F8_E5M2FNUZ, 0x7F, 57344.0f}, {DType::F8_E5M2FNUZ, 0x01, 0x1p-17f},
  };
  for (const auto& c : cases)
    EXPECT_EQ(f8_to_f32(c.kind, c.bits), c.value)
        << dtype_torch_name(c.kind) << " 0x" << std::hex << int{c.bits};
  EXPECT_EQ(bits(f8_to_f32(DType::F8_E4M3FN, 0x80)), 0x80000000u);  // -0 exists in the fn kinds
  EXPECT_EQ(bits(f8_to_f32(DType::F8_E5M2, 0x7C)), bits(INFINITY));
  EXPECT_EQ(bits(f8_to_f32(DType::F8_E5M2, 0xFC)), bits(-INFINITY));
  EXPECT_TRUE(std::isnan(f8_to_f32(DType::F8_E5M2, 0x7D)));
  EXPECT_EQ(bits(f8_to_f32(DType::F8_E4M3FN, 0x7F)), 0x7FF00000u);  // the only NaNs, no inf
  EXPECT_EQ(bits(f8_to_f32(DType::F8_E4M3FN, 0xFF)), 0xFFF00000u);
  EXPECT_EQ(f8_to_f32(DType::F8_E4M3FN, 0x78), 256.0f);  // exponent 15 is finite in e4m3fn
  for (DType k : {DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ}) {
    EXPECT_EQ(bits(f8_to_f32(k, 0x80)), 0x7F800001u);  // the one NaN: no -0, no inf
    EXPECT_EQ(bits(f8_to_f32(k, 0x00)), 0u);
  }
  const std::vector<uint8_t> src = {0x38, 0x7F, 0x01};
  std::vector<float> dst(3);
  convert(DType::F8_E4M3FN, DType::F32, std::as_bytes(std::span(src)),
          std::as_writable_bytes(std::span(dst)));
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_TRUE(std::isnan(dst[1]));
  EXPECT_EQ(dst[2], 0x1p-9f);
}

}  // namespace
}  // namespace ckptfs::catalog
