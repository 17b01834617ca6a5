// Data served as the source's own bytes (verbatim_rows.hpp) against what the converter's widening to float32
// and narrowing back gives element by element (gguf_numbers, tested against numpy and gguf-py): every
// sub-range of a BF16 tensor with NaNs, Llama's Q/K permutation written out from its definition, and every
// F16 bit pattern.
#include "views/gguf/verbatim_rows.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <memory>
#include <vector>

#include "catalog/dtype_convert.hpp"
#include "catalog/test_sources.hpp"
#include "views/gguf/gguf_numbers.hpp"

namespace ckptfs::views::gguf {
namespace {

using testing::SourceFile;

// A one-tensor catalog over all of `file` (its elements of `dtype`, in `shape`).
catalog::TensorRef source_tensor(const SourceFile& file, DType dtype, std::vector<int64_t> shape) {
  auto catalog = std::make_shared<catalog::Catalog>();
  catalog::LogicalTensor t;
  t.name = "w";
  t.dtype = dtype;
  t.shape = std::move(shape);
  const uint64_t numel = file.bytes().size() / dtype_size(dtype);
  t.source = catalog::FlatRuns{{{0, numel, file.file(), 0, dtype}}};
  catalog->tensors.push_back(std::move(t));
  return {std::move(catalog), 0};
}

float widened(DType dtype, uint16_t bits) {
  float f;
  catalog::convert(dtype, DType::F32, std::as_bytes(std::span(&bits, 1)),
                   std::as_writable_bytes(std::span(&f, 1)));
  return f;
}

// The data bytes of a one-tensor gguf file.
std::vector<std::byte> data_of(const GgufTensor& t, uint64_t offset, uint64_t length) {
  const auto file = make_gguf_file("", std::make_shared<const std::string>(), 0, {t});
  const uint64_t padded = (t.nbytes() + kAlignment - 1) / kAlignment * kAlignment;
  std::vector<std::byte> out(length);
  file->read(file->size() - padded + offset, out);
  return out;
}

TEST(VerbatimRows, Bf16WithNansAndPermutedRowsInEverySubRange) {
  constexpr uint64_t kHeads = 2, kHeadRows = 4, kRows = kHeads * kHeadRows, kCols = 3;
  std::vector<uint16_t> source(kRows * kCols);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint16_t>(0x3f80 + i * 0x111);
  source[1] = 0x7f81, source[7] = 0xff81, source[10] = 0x7fc0, source[13] = 0x7f80;  // sNaNs, a qNaN, inf
  const SourceFile file = SourceFile::of(source);
  const catalog::TensorRef ref = source_tensor(file, DType::BF16, {kRows, kCols});
  for (const uint64_t heads : {uint64_t{0}, kHeads}) {
    std::vector<uint16_t> expected;
    for (uint64_t row = 0; row < kRows; ++row) {
      // permute: out row h*hd + 2i + j is source row h*hd + j*hd/2 + i
      const uint64_t h = row / kHeadRows, i = row % kHeadRows / 2, j = row % 2;
      const uint64_t from = heads == 0 ? row : h * kHeadRows + j * kHeadRows / 2 + i;
      for (uint64_t c = 0; c < kCols; ++c)
        expected.push_back(
            f32_to_bf16(std::bit_cast<uint32_t>(widened(DType::BF16, source[from * kCols + c]))));
    }
    const GgufTensor t{"w.weight", {kCols, kRows}, GgmlType::bf16, SourceRows{ref, heads}};
    ASSERT_NE(verbatim_rows(t), nullptr);
    const auto* want = reinterpret_cast<const std::byte*>(expected.data());
    const uint64_t n = expected.size() * 2;
    for (uint64_t offset = 0; offset < n; ++offset)
      for (uint64_t length = 1; offset + length <= n; ++length)
        ASSERT_EQ(data_of(t, offset, length), std::vector<std::byte>(want + offset, want + offset + length))
            << "heads " << heads << ", bytes [" << offset << ", " << offset + length << ")";
  }
}

// The converter keeps an F16 tensor as numpy float16 and writes it with astype(np.float16): bit for bit,
// signalling NaNs included (docs/formats/gguf.md); so does widening with numpy's rule and narrowing back.
TEST(VerbatimRows, EveryF16BitPatternComesBackAsTheConverterWritesIt) {
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const SourceFile file = SourceFile::of(all);
  const GgufTensor t{
      "w.weight", {256, 256}, GgmlType::f16, SourceRows{source_tensor(file, DType::F16, {256, 256}), 0}};
  ASSERT_NE(verbatim_rows(t), nullptr);
  const auto got = data_of(t, 0, all.size() * 2);
  for (size_t i = 0; i < all.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, got.data() + 2 * i, 2);
    ASSERT_EQ(v, all[i]) << std::hex << i;
    ASSERT_EQ(f32_to_f16(f16_to_f32(all[i])), all[i]) << std::hex << i;
  }
}

TEST(VerbatimRows, OnlyTheSourceDtypeIsVerbatim) {
  const SourceFile file = SourceFile::of(std::vector<uint16_t>(64));
  const auto ref = source_tensor(file, DType::BF16, {2, 32});
  EXPECT_EQ(verbatim_rows({"w.weight", {32, 2}, GgmlType::f16, SourceRows{ref, 0}}), nullptr);
  EXPECT_EQ(verbatim_rows({"w.weight", {32, 2}, GgmlType::q8_0, SourceRows{ref, 0}}), nullptr);
  EXPECT_EQ(verbatim_rows({"w.weight", {32, 2}, GgmlType::f32, SourceRows{ref, 0}}), nullptr);
}

}  // namespace
}  // namespace ckptfs::views::gguf
