// A GGUF file's tensor data read in pieces the way the kernel and `ckptfs export` ask for them: unaligned to
// the encoding's units, spanning many conversion steps, up to the tensor's end. Expected bytes are the blocks
// quantized one by one (gguf_numbers, itself tested against numpy and gguf-py).
#include "views/gguf/gguf_file.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "views/gguf/gguf_numbers.hpp"

namespace ckptfs::views::gguf {
namespace {

TEST(GgufFile, Q8DataReadAcrossStepsAndUnalignedEndsAtTheTensorEnd) {
  constexpr uint64_t kBlocks =
      6149;  // 196,768 elements: several 64 Ki-element steps, not a whole number of them
  std::vector<float> values(kBlocks * kQ8Block);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.0f;
  std::vector<uint8_t> expected(kBlocks * kQ8BlockBytes);
  for (uint64_t b = 0; b < kBlocks; ++b)
    quantize_q8_0_block(
        std::span<const float, kQ8Block>(values.data() + b * kQ8Block, kQ8Block),
        std::span<uint8_t, kQ8BlockBytes>(expected.data() + b * kQ8BlockBytes, kQ8BlockBytes));
  const GgufTensor t{"t.weight", {kQ8Block, kBlocks}, GgmlType::q8_0, ComputedF32{values}};
  const auto file = make_gguf_file("", std::make_shared<const std::string>(), 0, {t});
  const uint64_t padded = (expected.size() + kAlignment - 1) / kAlignment * kAlignment;
  const uint64_t data = file->size() - padded;

  const auto read_matches = [&](uint64_t at, uint64_t size) {
    std::vector<std::byte> got(size);
    file->read(data + at, got);
    return std::equal(got.begin(), got.end(), expected.begin() + static_cast<ptrdiff_t>(at),
                      [](std::byte a, uint8_t b) { return std::to_integer<uint8_t>(a) == b; });
  };
  for (const uint64_t start : {uint64_t{0}, uint64_t{5}, uint64_t{33}, uint64_t{69'633}})
    EXPECT_TRUE(read_matches(start, expected.size() - start)) << "to the end in one read from byte " << start;
  for (uint64_t at = 0; at < expected.size(); at += 100'001)  // odd-sized pieces, the last one short
    EXPECT_TRUE(read_matches(at, std::min<uint64_t>(100'001, expected.size() - at))) << "from byte " << at;
}

}  // namespace
}  // namespace ckptfs::views::gguf
