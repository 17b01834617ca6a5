// ExtentFile lookup and reads across extents, and the simple virtual files.
#include "ckptfs/views.hpp"

#include <gtest/gtest.h>

#include <random>

#include "catalog/test_sources.hpp"

namespace ckptfs::views {
namespace {

using testing::SourceFile;

std::string read_all(const VirtualFile& f, uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  f.read(offset, std::as_writable_bytes(std::span(out)));
  return out;
}

catalog::LogicalTensor bytes_tensor(const SourceFile& src, uint64_t offset, uint64_t n) {
  return {
      .name = "u8",
      .dtype = DType::U8,
      .shape = {static_cast<int64_t>(n)},
      .source =
          catalog::FlatRuns{{{.count = n, .file = src.file(), .src_offset = offset, .src_dtype = DType::U8}}},
      .origin = {}};
}

TEST(Views, ExtentFileReadsAcrossExtents) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  const SourceFile src(std::as_bytes(std::span(text)));
  std::mt19937 rng(1);
  // Alternating inline and tensor extents of random lengths (some empty), and the expected bytes.
  auto tensors = std::make_shared<catalog::Catalog>();
  auto inline_bytes = std::make_shared<const std::string>("0123456789ABCDEFGHIJ");
  std::vector<Extent> extents;
  std::string expected;
  for (int i = 0; i < 100; ++i) {
    Extent e;
    e.offset = expected.size();
    if (i % 2) {
      e.length = rng() % 20;
      const uint64_t offset = rng() % 10;
      const uint64_t src_offset = rng() % 4000;
      tensors->tensors.push_back(bytes_tensor(src, src_offset, offset + e.length + rng() % 3));
      e.source = TensorBytes{{tensors, tensors->tensors.size() - 1}, offset};
      expected += text.substr(src_offset + offset, e.length);
    } else {
      const uint64_t offset = rng() % 10;
      e.length = rng() % 10;
      e.source = InlineBytes{inline_bytes, offset};
      expected += inline_bytes->substr(offset, e.length);
    }
    extents.push_back(e);
  }
  const ExtentFile file(std::move(extents));
  ASSERT_EQ(file.size(), expected.size());
  EXPECT_EQ(read_all(file, 0, expected.size()), expected);
  for (int r = 0; r < 2000; ++r) {
    const uint64_t offset = rng() % (expected.size() + 1);
    const uint64_t length = rng() % (expected.size() - offset + 1);
    ASSERT_EQ(read_all(file, offset, length), expected.substr(offset, length)) << offset << "+" << length;
  }
  EXPECT_THROW(read_all(file, expected.size() - 1, 2), std::out_of_range);
  ASSERT_EQ(file.sources().size(), 1u);
  EXPECT_EQ(file.sources()[0], src.file());
}

TEST(Views, APrefetchEndIsRoundedUpToARequestWithinTheBytesNeeded) {
  const std::vector<std::pair<uint64_t, uint64_t>> needed = {{100, 250}, {300, 1000}};
  EXPECT_EQ(round_up_within(needed, 120, 64), 128);   // to the next multiple
  EXPECT_EQ(round_up_within(needed, 200, 64), 250);   // no further than the range holding byte 199
  EXPECT_EQ(round_up_within(needed, 250, 64), 250);   // the range's own end
  EXPECT_EQ(round_up_within(needed, 256, 64), 256);   // byte 255 is needed by none: as it was
  EXPECT_EQ(round_up_within(needed, 320, 256), 512);  // a range further on
  EXPECT_EQ(round_up_within(needed, 512, 256), 512);  // on a multiple already
  EXPECT_EQ(round_up_within(needed, 900, 256), 1000);
  EXPECT_EQ(round_up_within(needed, 1200, 256), 1200);  // past every range
  EXPECT_EQ(round_up_within({}, 10, 64), 10);
}

TEST(Views, ExtentFileRejectsHolesAndOverlaps) {
  auto bytes = std::make_shared<const std::string>("abcdef");
  const auto extent = [&](uint64_t offset, uint64_t length) {
    return Extent{.offset = offset, .length = length, .source = InlineBytes{bytes}};
  };
  EXPECT_THROW(ExtentFile({extent(0, 2), extent(3, 2)}), std::invalid_argument);
  EXPECT_THROW(ExtentFile({extent(0, 2), extent(1, 2)}), std::invalid_argument);
  EXPECT_THROW(ExtentFile({extent(1, 2)}), std::invalid_argument);
  EXPECT_THROW(ExtentFile({Extent{.length = 1, .source = InlineBytes{}}}), std::invalid_argument);
  EXPECT_THROW(ExtentFile({Extent{.length = 1, .source = TensorBytes{}}}), std::invalid_argument);
  EXPECT_EQ(ExtentFile({}).size(), 0u);
  const ExtentFile ok({extent(0, 2), extent(2, 0), extent(2, 3)});
  EXPECT_EQ(read_all(ok, 0, 5), "ababc");
  EXPECT_TRUE(ok.sources().empty());
}

TEST(Views, BytesAndPassthroughFiles) {
  const auto json = make_bytes_file("{\"a\": 1}\n");
  EXPECT_EQ(json->size(), 9u);
  EXPECT_EQ(read_all(*json, 2, 3), "a\":");
  EXPECT_TRUE(json->sources().empty());

  const std::string text = "config bytes";
  const SourceFile src(std::as_bytes(std::span(text)));
  const auto pass = make_passthrough(src.file());
  EXPECT_EQ(pass->size(), text.size());
  EXPECT_EQ(read_all(*pass, 7, 5), "bytes");
  ASSERT_EQ(pass->sources().size(), 1u);
  EXPECT_EQ(pass->sources()[0], src.file());
}

}  // namespace
}  // namespace ckptfs::views
