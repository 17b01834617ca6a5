// The conversions against the values numpy and gguf-py give (docs/formats/gguf.md; numpy 2.4 on x86-64).
#include "views/gguf/gguf_numbers.hpp"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

namespace ckptfs::views::gguf {
namespace {

TEST(GgufNumbers, F16RoundsAsNumpy) {
  // numpy float32 -> float16: overflow edge, subnormals, round to nearest even, NaN payloads not quieted
  const std::array<std::pair<uint32_t, uint16_t>, 10> cases = {{{0x477FF000, 0x7C00},
                                                                {0x477FEFFF, 0x7BFF},
                                                                {0x33000000, 0x0000},
                                                                {0x33000001, 0x0001},
                                                                {0x387FC000, 0x03FF},
                                                                {0x3F800000, 0x3C00},
                                                                {0x7F800001, 0x7C01},
                                                                {0x7FA12345, 0x7D09},
                                                                {0xFFC00001, 0xFE00},
                                                                {0xFF800000, 0xFC00}}};
  for (const auto& [f32, f16] : cases) EXPECT_EQ(f32_to_f16(f32), f16) << std::hex << f32;
}

TEST(GgufNumbers, F16WidensAsNumpy) {
  // npy_halfbits_to_floatbits: exact, subnormals normalized, NaN payloads kept (not quieted)
  EXPECT_EQ(f16_to_f32(0x8000), 0x80000000u);
  EXPECT_EQ(f16_to_f32(0x0001), 0x33800000u);  // the smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), 0x387FC000u);  // the largest
  EXPECT_EQ(f16_to_f32(0xFBFF), 0xC77FE000u);
  EXPECT_EQ(f16_to_f32(0x7C01), 0x7F802000u);  // a signalling NaN stays one
  EXPECT_EQ(f16_to_f32(0xFC00), 0xFF800000u);
}

TEST(GgufNumbers, Bf16RoundsAsGgufPy) {
  EXPECT_EQ(f32_to_bf16(0x7FA12345), 0x7FE1);  // NaN quieted, payload kept
  EXPECT_EQ(f32_to_bf16(0x477FF000), 0x4780);
  EXPECT_EQ(f32_to_bf16(0x7F800000), 0x7F80);
  EXPECT_EQ(f32_to_bf16(0x3F808000), 0x3F80);  // a tie to even
  EXPECT_EQ(f32_to_bf16(0x3F818000), 0x3F82);
}

TEST(GgufNumbers, Q8BlockRoundsHalfAwayFromZero) {
  std::array<float, kQ8Block> x{};
  x[0] = 127.0f;  // d = 1: q = round(x)
  x[1] = 63.5f;
  x[2] = -63.5f;
  x[3] = 0.5f;
  x[4] = 2.5f;
  std::array<uint8_t, kQ8BlockBytes> out{};
  quantize_q8_0_block(x, out);
  EXPECT_EQ(out[0] | out[1] << 8, 0x3C00);  // f16(1.0)
  EXPECT_EQ(static_cast<int8_t>(out[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(out[3]), 64);
  EXPECT_EQ(static_cast<int8_t>(out[4]), -64);
  EXPECT_EQ(static_cast<int8_t>(out[5]), 1);
  EXPECT_EQ(static_cast<int8_t>(out[6]), 3);
}

TEST(GgufNumbers, Q8BlockOfZerosOrNaN) {
  std::array<float, kQ8Block> x{};
  std::array<uint8_t, kQ8BlockBytes> out{};
  out.fill(0xFF);
  quantize_q8_0_block(x, out);
  for (uint8_t b : out) EXPECT_EQ(b, 0);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = 3.0f;
  quantize_q8_0_block(x, out);
  EXPECT_EQ(out[0] | out[1] << 8, 0x7E00);
  for (size_t j = 2; j < out.size(); ++j) EXPECT_EQ(out[j], 0);
}

TEST(GgufNumbers, Q8RoundsEveryHalfAwayFromZeroAsStdRound) {
  // amax 127: d = 1, so x * id is x itself; every half and its neighbours on both sides of zero
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> any(-127.0f, 127.0f);
  for (int block = 0; block < 2000; ++block) {
    std::array<float, kQ8Block> x{};
    x[0] = block % 2 ? 127.0f : -127.0f;
    for (size_t j = 1; j < kQ8Block; ++j) {
      const float half = static_cast<float>(static_cast<int>(rng() % 253) - 126) + 0.5f;
      x[j] = j % 3 == 0 ? any(rng) : j % 3 == 1 ? half : std::nextafter(half, j % 2 ? 200.0f : -200.0f);
    }
    std::array<uint8_t, kQ8BlockBytes> out{};
    quantize_q8_0_block(x, out);
    for (size_t j = 0; j < kQ8Block; ++j)
      ASSERT_EQ(static_cast<int8_t>(out[2 + j]), static_cast<int8_t>(std::round(x[j]))) << x[j];
  }
}

}  // namespace
}  // namespace ckptfs::views::gguf
