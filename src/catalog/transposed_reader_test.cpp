// Transposed tensors (Hugging Face GPT-2's Conv1D weights) read through tiles, against a brute-force
// transpose of the source values computed by the test: flat and tensor-parallel (boxed) sources, several
// shapes (one far above the tile and band sizes, one with output rows longer than a tile), dtype
// conversion, random and concurrent ranges, and the source runs prefetch is told about.
#include "catalog/transposed_reader.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "catalog/test_sources.hpp"

namespace ckptfs::catalog {
namespace {

using testing::SourceFile;
namespace ref = testing::reference;

// A [rows, cols] source tensor over files, and the bytes its transpose must be served as.
struct Case {
  std::vector<std::unique_ptr<SourceFile>> files;
  LogicalTensor transposed;
  std::vector<std::byte> expected;
};

// Source element i as `from` (bits derived from i, never NaN so conversions are plain) and as served in `to`.
uint32_t source_bits(uint64_t i) {
  return static_cast<uint32_t>((i * 2654435761u) & 0x3FFFFFFF) | 0x3C000000u;  // positive, finite
}
void served_element(uint64_t i, DType from, DType to, std::byte* out) {
  const uint32_t w = source_bits(i);
  if (from == DType::F32 && to == DType::F32) return (void)std::memcpy(out, &w, 4);
  const uint16_t h = static_cast<uint16_t>(w >> 16);
  if (from == DType::BF16 && to == DType::F32) {
    const uint32_t f = ref::bf16_to_f32(h);
    return (void)std::memcpy(out, &f, 4);
  }
  const uint16_t b = from == DType::BF16 ? h : ref::f32_to_bf16(w);  // served as BF16
  std::memcpy(out, &b, 2);
}
std::vector<std::byte> source_file_bytes(uint64_t first, uint64_t count, DType from) {
  std::vector<std::byte> out(count * dtype_size(from));
  for (uint64_t k = 0; k < count; ++k) {
    const uint32_t w = source_bits(first + k);
    const uint16_t h = static_cast<uint16_t>(w >> 16);
    if (from == DType::F32)
      std::memcpy(out.data() + k * 4, &w, 4);
    else
      std::memcpy(out.data() + k * 2, &h, 2);
  }
  return out;
}

void fill_expected(Case& c, int64_t rows, int64_t cols, DType from, DType to) {
  const uint64_t size = dtype_size(to), r_n = static_cast<uint64_t>(rows), c_n = static_cast<uint64_t>(cols);
  c.expected.resize(r_n * c_n * size);
  for (uint64_t r = 0; r < r_n; ++r)
    for (uint64_t col = 0; col < c_n; ++col) served_element(r * c_n + col, from, to, c.expected.data() + (col * r_n + r) * size);
}

// One file holding the source row-major, as flat runs cut at random points.
Case flat_case(int64_t rows, int64_t cols, DType from, DType to, std::mt19937& rng) {
  Case c;
  const uint64_t numel = static_cast<uint64_t>(rows * cols);
  c.files.push_back(std::make_unique<SourceFile>(source_file_bytes(0, numel, from)));
  LogicalTensor src;
  src.name = "src";
  src.dtype = to;
  src.shape = {rows, cols};
  for (uint64_t e = 0; e < numel;) {
    const uint64_t n = std::min<uint64_t>(numel - e, 1 + rng() % (numel / 3 + 1));
    std::get<FlatRuns>(src.source).pieces.push_back({e, n, c.files[0]->file(), e * dtype_size(from), from});
    e += n;
  }
  validate(src);
  c.transposed = transposed_tensor("t", src);
  fill_expected(c, rows, cols, from, to);
  return c;
}

// The source split by columns over two tensor-parallel files at `cut` (a row-parallel linear's weight).
Case boxed_case(int64_t rows, int64_t cols, int64_t cut, DType from, DType to) {
  Case c;
  std::vector<Box> boxes;
  for (const auto& [lo, hi] : {std::pair{int64_t{0}, cut}, std::pair{cut, cols}}) {
    std::vector<std::byte> bytes;  // this rank's [rows, hi - lo] part, row-major
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = source_file_bytes(static_cast<uint64_t>(r * cols + lo), static_cast<uint64_t>(hi - lo), from);
      bytes.insert(bytes.end(), row.begin(), row.end());
    }
    c.files.push_back(std::make_unique<SourceFile>(bytes));
    Box b;
    b.offsets = {0, lo};
    b.sizes = {rows, hi - lo};
    b.source.storage = {c.files.back()->file(), 0, c.files.back()->file()->size()};
    b.source.dtype = from;
    b.source.shape = b.sizes;
    b.source.strides = {hi - lo, 1};
    boxes.push_back(std::move(b));
  }
  c.transposed = transposed_tensor("t", assembled_tensor("src", to, {rows, cols}, std::move(boxes), "tp"));
  fill_expected(c, rows, cols, from, to);
  return c;
}

void expect_range(const Case& c, uint64_t offset, uint64_t length) {
  std::vector<std::byte> got(length);
  read_tensor(c.transposed, offset, got);
  ASSERT_EQ(std::memcmp(got.data(), c.expected.data() + offset, length), 0)
      << "bytes [" << offset << ", +" << length << ") of a [" << c.transposed.shape[0] << ", "
      << c.transposed.shape[1] << "] transpose";
}

void expect_random_ranges(const Case& c, std::mt19937& rng, int n) {
  const uint64_t total = c.expected.size();
  for (int i = 0; i < n; ++i) {
    const uint64_t offset = rng() % total;
    const uint64_t cap = std::array<uint64_t, 3>{64, 200 << 10, 3 << 20}[rng() % 3];
    expect_range(c, offset, 1 + rng() % std::min(cap, total - offset));
  }
}

TEST(TransposedReader, FlatSourcesOfManyShapesMatchBruteForce) {
  std::mt19937 rng(7);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {64, 1}, {1, 300}, {200, 300}, {40000, 70}}) {
    const Case c = flat_case(rows, cols, DType::F32, DType::F32, rng);
    expect_range(c, 0, c.expected.size());
    expect_random_ranges(c, rng, 60);
  }
}

TEST(TransposedReader, SourceFarAboveTileSizeReadFrontToBackAndAtRandom) {
  std::mt19937 rng(11);
  const Case c = flat_case(3000, 5000, DType::F32, DType::F32, rng);  // 60 MB
  for (uint64_t off = 0; off < c.expected.size(); off += 128 << 10)
    expect_range(c, off, std::min<uint64_t>(128 << 10, c.expected.size() - off));
  expect_random_ranges(c, rng, 40);
}

TEST(TransposedReader, ConvertsDtypes) {
  std::mt19937 rng(13);
  expect_random_ranges(flat_case(700, 900, DType::BF16, DType::F32, rng), rng, 40);
  expect_random_ranges(flat_case(700, 900, DType::F32, DType::BF16, rng), rng, 40);
}

TEST(TransposedReader, TensorParallelSourceMatchesBruteForce) {
  std::mt19937 rng(17);
  const Case c = boxed_case(2304, 1500, 611, DType::BF16, DType::F32);  // 13.8 MB served
  expect_range(c, 0, c.expected.size());
  expect_random_ranges(c, rng, 60);
}

TEST(TransposedReader, ConcurrentReadsShareTilesAndAgree) {
  std::mt19937 rng(19);
  const Case a = flat_case(2000, 3000, DType::F32, DType::F32, rng);
  const Case b = boxed_case(1000, 2500, 1200, DType::BF16, DType::F32);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches = 0;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 r(100 + t);
      for (int i = 0; i < 40; ++i) {
        const Case& c = (i + t) % 2 ? a : b;
        const uint64_t offset = r() % c.expected.size(), length = 1 + r() % std::min<uint64_t>(1 << 20, c.expected.size() - offset);
        std::vector<std::byte> got(length);
        read_tensor(c.transposed, offset, got);
        if (std::memcmp(got.data(), c.expected.data() + offset, length) != 0) ++mismatches;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, 0);
}

// Every source byte a transposed range is read from lies in a run append_runs reports for that range.
TEST(TransposedReader, RunsCoverTheSourceBytesOfARange) {
  std::mt19937 rng(23);
  const Case c = boxed_case(300, 200, 77, DType::F32, DType::F32);
  const uint64_t rows = 300, cols = 200;
  for (int i = 0; i < 50; ++i) {
    const uint64_t first = rng() % (rows * cols), count = 1 + rng() % std::min<uint64_t>(rng() % 2 ? 250 : 5000, rows * cols - first);
    std::vector<Piece> runs;
    append_runs(c.transposed, first, count, runs);
    uint64_t covered_bytes = 0;
    for (const Piece& p : runs) covered_bytes += p.count * 4;
    EXPECT_LE(covered_bytes, (count + 2 * rows) * 4) << "runs far beyond the range";
    for (uint64_t e = first; e < first + count; ++e) {
      const uint64_t r = e % rows, col = e / rows;  // the source element [r, col]
      const size_t file = col < 77 ? 0 : 1;
      const uint64_t offset = (col < 77 ? r * 77 + col : r * 123 + col - 77) * 4;
      const bool found = std::any_of(runs.begin(), runs.end(), [&](const Piece& p) {
        return p.file == c.files[file]->file() && p.src_offset <= offset && offset < p.src_offset + p.count * 4;
      });
      ASSERT_TRUE(found) << "element " << e << " of range [" << first << ", +" << count << ")";
    }
  }
}

}  // namespace
}  // namespace ckptfs::catalog
