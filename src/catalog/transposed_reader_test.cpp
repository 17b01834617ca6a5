// Transposed tensors (Hugging Face GPT-2's Conv1D weights) read through tiles, against a brute-force
// transpose of the source values computed by the test: flat and tensor-parallel (boxed) sources, several
// shapes (sources far above the cache, one with output rows longer than a tile), dtype conversion,
// random and concurrent ranges, the number of source reads, and the source runs prefetch is told about.
// Each test reads through caches of its own, of the size it needs.
#include "catalog/transposed_reader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "catalog/test_sources.hpp"

namespace ckptfs::catalog {
namespace {

using testing::bytes_read;
using testing::read_syscalls;
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
    for (uint64_t col = 0; col < c_n; ++col)
      served_element(r * c_n + col, from, to, c.expected.data() + (col * r_n + r) * size);
}

// One file holding the source row-major, as flat runs cut at random points; tiles kept in `tiles`.
Case flat_case(int64_t rows, int64_t cols, DType from, DType to, std::mt19937& rng,
               std::shared_ptr<TransposeCache> tiles = make_transpose_cache()) {
  Case c;
  const uint64_t numel = static_cast<uint64_t>(rows * cols);
  c.files.push_back(std::make_unique<SourceFile>(source_file_bytes(0, numel, from)));
  LogicalTensor src;
  src.name = "src";
  src.dtype = to;
  src.shape = {rows, cols};
  FlatRuns runs;
  for (uint64_t e = 0; e < numel;) {
    const uint64_t n = std::min<uint64_t>(numel - e, 1 + rng() % (numel / 3 + 1));
    runs.pieces.push_back({e, n, c.files[0]->file(), e * dtype_size(from), from});
    e += n;
  }
  src.source = std::move(runs);
  validate(src);
  c.transposed = transposed_tensor("t", src, std::move(tiles));
  fill_expected(c, rows, cols, from, to);
  return c;
}

// The source split by columns over two tensor-parallel files at `cut` (a row-parallel linear's weight);
// tiles kept in `tiles`.
Case boxed_case(int64_t rows, int64_t cols, int64_t cut, DType from, DType to,
                std::shared_ptr<TransposeCache> tiles = make_transpose_cache()) {
  Case c;
  std::vector<Box> boxes;
  for (const auto& [lo, hi] : {std::pair{int64_t{0}, cut}, std::pair{cut, cols}}) {
    std::vector<std::byte> bytes;  // this rank's [rows, hi - lo] part, row-major
    for (int64_t r = 0; r < rows; ++r) {
      const auto row =
          source_file_bytes(static_cast<uint64_t>(r * cols + lo), static_cast<uint64_t>(hi - lo), from);
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
  c.transposed = transposed_tensor("t", assembled_tensor("src", to, {rows, cols}, std::move(boxes), "tp"),
                                   std::move(tiles));
  fill_expected(c, rows, cols, from, to);
  return c;
}

// `c`'s tensor read through a new cache of `bytes`.
void read_through_cache_of(Case& c, uint64_t bytes) {
  c.transposed =
      transposed_tensor("t", *std::get<Transposed>(c.transposed.source).of, make_transpose_cache(bytes));
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
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {64, 1}, {1, 300}, {200, 300}, {40000, 70}}) {
    const Case c = flat_case(rows, cols, DType::F32, DType::F32, rng);
    expect_range(c, 0, c.expected.size());
    expect_random_ranges(c, rng, 60);
  }
}

TEST(TransposedReader, SourceFarAboveTheCacheReadFrontToBackAndAtRandom) {
  std::mt19937 rng(11);
  Case c = flat_case(3000, 5000, DType::F32, DType::F32, rng);                     // 60 MB
  for (const uint64_t cache : {uint64_t{4} << 20, kDefaultTransposeCacheBytes}) {  // 15x the cache; 0.45x
    read_through_cache_of(c, cache);
    for (uint64_t off = 0; off < c.expected.size(); off += 128 << 10)
      expect_range(c, off, std::min<uint64_t>(128 << 10, c.expected.size() - off));
    expect_random_ranges(c, rng, 40);
  }
}

// A row-parallel weight of TP 2 (each source row in two files) 18x the cache's tiles, read front to back
// as the kernel asks: each tile reads whole bands of rows with a few reads per file, never one per row
// (18 tiles x 4096 rows would be 73,728 reads) nor per element.
TEST(TransposedReader, TensorParallelSourceFarAboveTheCacheIsReadInFewLargeReads) {
  const Case c =
      boxed_case(4096, 2304, 1152, DType::BF16, DType::BF16, make_transpose_cache(4 << 20));  // 18.9 MB
  std::vector<std::byte> got(128 << 10);
  const uint64_t before = read_syscalls();
  for (uint64_t off = 0; off < c.expected.size(); off += got.size()) {
    const auto chunk = std::span(got).first(std::min<uint64_t>(got.size(), c.expected.size() - off));
    read_tensor(c.transposed, off, chunk);
    ASSERT_EQ(std::memcmp(chunk.data(), c.expected.data() + off, chunk.size()), 0) << "bytes at " << off;
  }
  EXPECT_LT(read_syscalls() - before, 1000u);
}

// A row-parallel weight of TP 2 that fits in half the cache but not in a tile, read front to back as the
// kernel asks: tiles of whole output columns, so each source byte is read once (tiles of whole output
// rows would read every source row once per tile), and each reply comes straight from the tiles.
TEST(TransposedReader, SourceThatFitsHalfTheCacheIsReadOnce) {
  // 8.4 MB in tiles of 2 MiB: 4 tiles of 1024 columns
  const Case c = boxed_case(4096, 1024, 400, DType::BF16, DType::BF16, make_transpose_cache(16 << 20));
  std::vector<std::byte> got(128 << 10);
  std::vector<DeferredRun> deferred;
  uint64_t held = 0;
  const uint64_t before = bytes_read();
  for (uint64_t off = 0; off < c.expected.size(); off += got.size()) {
    const auto chunk = std::span(got).first(std::min<uint64_t>(got.size(), c.expected.size() - off));
    deferred.clear();
    read_tensor(c.transposed, off, chunk, &deferred);
    for (const DeferredRun& run : deferred) {
      std::memcpy(run.dst, std::get<HeldBytes>(run.from).data, run.length);
      held += run.length;
    }
    ASSERT_EQ(std::memcmp(chunk.data(), c.expected.data() + off, chunk.size()), 0) << "bytes at " << off;
  }
  EXPECT_EQ(held, c.expected.size());
  EXPECT_LE(bytes_read() - before, c.expected.size() + (64 << 10));
}

// Elements of 1 and 8 bytes (the scalar transpose; 2 and 4 have SIMD kernels), as they are: bytes of the
// source moved whole, element by element.
TEST(TransposedReader, OneAndEightByteElementsMatchBruteForce) {
  std::mt19937 rng(29);
  for (const DType dtype : {DType::U8, DType::F64}) {
    const int64_t rows = 301, cols = 517;
    const uint64_t size = dtype_size(dtype), numel = static_cast<uint64_t>(rows * cols);
    std::vector<std::byte> bytes(numel * size);
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    Case c;
    c.files.push_back(std::make_unique<SourceFile>(bytes));
    LogicalTensor src;
    src.name = "src";
    src.dtype = dtype;
    src.shape = {rows, cols};
    src.source = FlatRuns{{{0, numel, c.files[0]->file(), 0, dtype}}};
    validate(src);
    c.transposed = transposed_tensor("t", src, make_transpose_cache());
    c.expected.resize(bytes.size());
    for (uint64_t r = 0; r < static_cast<uint64_t>(rows); ++r)
      for (uint64_t col = 0; col < static_cast<uint64_t>(cols); ++col)
        std::memcpy(c.expected.data() + (col * rows + r) * size, bytes.data() + (r * cols + col) * size,
                    size);
    expect_range(c, 0, c.expected.size());
    expect_random_ranges(c, rng, 40);
  }
}

// Two tensors that fit the cache together, read a chunk of each in turn, each tensor's chunks in random
// order (as concurrent readahead requests may be served): a tile counts as read to its end only once all
// its bytes were served, so neither tensor's tiles make room for the other's early and each source is
// read once.
TEST(TransposedReader, ChunksServedOutOfOrderBuildEachTileOnce) {
  const auto cache = make_transpose_cache(16 << 20);  // 8 tiles of 2 MiB: 4 per tensor
  const Case a = boxed_case(4096, 1024, 400, DType::BF16, DType::BF16, cache);
  const Case b = boxed_case(4096, 1024, 700, DType::BF16, DType::BF16, cache);
  const uint64_t chunk = 128 << 10;
  std::vector<uint64_t> order(a.expected.size() / chunk);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::mt19937 rng(31);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::byte> got(chunk);
  const uint64_t before = bytes_read();
  for (const uint64_t i : order)
    for (const Case* c : {&a, &b}) {
      read_tensor(c->transposed, i * chunk, got);
      ASSERT_EQ(std::memcmp(got.data(), c->expected.data() + i * chunk, chunk), 0) << "chunk " << i;
    }
  EXPECT_LE(bytes_read() - before, a.expected.size() + b.expected.size() + (64 << 10));
}

TEST(TransposedReader, ConvertsDtypes) {
  std::mt19937 rng(13);
  expect_random_ranges(flat_case(700, 900, DType::BF16, DType::F32, rng), rng, 40);
  expect_random_ranges(flat_case(700, 900, DType::F32, DType::BF16, rng), rng, 40);
}

TEST(TransposedReader, TensorParallelSourceMatchesBruteForce) {
  std::mt19937 rng(17);
  Case c = boxed_case(2304, 1500, 611, DType::BF16, DType::F32);  // 13.8 MB served
  expect_range(c, 0, c.expected.size());
  expect_random_ranges(c, rng, 60);
  read_through_cache_of(c, 1 << 20);  // 13x the cache
  expect_range(c, 0, c.expected.size());
  expect_random_ranges(c, rng, 60);
}

TEST(TransposedReader, ConcurrentReadsShareTilesAndAgree) {
  std::mt19937 rng(19);
  const auto cache = make_transpose_cache();
  const Case a = flat_case(2000, 3000, DType::F32, DType::F32, rng, cache);
  const Case b = boxed_case(1000, 2500, 1200, DType::BF16, DType::F32, cache);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches = 0;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 r(100 + t);
      for (int i = 0; i < 40; ++i) {
        const Case& c = (i + t) % 2 ? a : b;
        const uint64_t offset = r() % c.expected.size(),
                       length = 1 + r() % std::min<uint64_t>(1 << 20, c.expected.size() - offset);
        std::vector<std::byte> got(length);
        read_tensor(c.transposed, offset, got);
        if (std::memcmp(got.data(), c.expected.data() + offset, length) != 0) ++mismatches;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, 0);
}

// A reply may hold a tile past its tensor and the tensor's cache (a command's reads end before its cache
// goes, but a tile's buffer keeps the pool it returns to alive either way).
TEST(TransposedReader, HeldTileOutlivesItsCache) {
  std::mt19937 rng(37);
  std::vector<std::byte> got(64 << 10);
  std::vector<DeferredRun> deferred;
  std::vector<std::byte> expected;
  {
    const Case c = flat_case(300, 400, DType::F32, DType::F32, rng);  // one tile
    read_tensor(c.transposed, 0, got, &deferred);
    expected.assign(c.expected.begin(), c.expected.begin() + static_cast<ptrdiff_t>(got.size()));
  }  // the tensor, its cache and its source file gone
  ASSERT_FALSE(deferred.empty());
  for (const DeferredRun& run : deferred)
    std::memcpy(run.dst, std::get<HeldBytes>(run.from).data, run.length);
  EXPECT_EQ(got, expected);
}

// Byte intervals [offset, end) per file, sorted and merged where they touch.
using Intervals = std::map<const io::File*, std::vector<std::pair<uint64_t, uint64_t>>>;
Intervals merged(Intervals in) {
  for (auto& [file, list] : in) {
    std::sort(list.begin(), list.end());
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (const auto& iv : list)
      if (!out.empty() && iv.first <= out.back().second)
        out.back().second = std::max(out.back().second, iv.second);
      else
        out.push_back(iv);
    list = std::move(out);
  }
  return in;
}

// Prefetch is told the source block of each tile a range starts (rows x the tile's source columns, here
// computed from the test's own layout of the two tensor-parallel files), exactly, and nothing for a
// range inside a tile: a front-to-back read builds a tile, reading its whole block, at its first element.
TEST(TransposedReader, RunsAreTheSourceBlocksOfTheTilesARangeStarts) {
  const uint64_t rows = 2000, cols = 1000, cut = 377;  // the source; tiles 2 across the 2000 output columns
  // tiles of 65,536 F32 elements: 63 output rows x 1000 columns
  const Case c = boxed_case(rows, cols, cut, DType::F32, DType::F32, make_transpose_cache(1 << 20));
  const uint64_t tile_rows = 63, tile_cols = 1000;
  std::mt19937 rng(23);
  int empty = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t first = rng() % (rows * cols);
    const uint64_t count = 1 + rng() % std::min<uint64_t>(i % 2 ? 3000 : 300000, rows * cols - first);
    std::vector<Piece> runs;
    append_runs(c.transposed, first, count, runs);
    Intervals got, expected;
    for (const Piece& p : runs) got[p.file.get()].push_back({p.src_offset, p.src_offset + p.count * 4});
    for (uint64_t out_row = 0; out_row < cols; out_row += tile_rows)
      for (uint64_t out_col = 0; out_col < rows; out_col += tile_cols) {
        const uint64_t start = out_row * rows + out_col;
        if (start < first || start >= first + count) continue;
        for (uint64_t r = out_col; r < std::min(rows, out_col + tile_cols); ++r)  // a source row
          for (uint64_t col = out_row; col < std::min(cols, out_row + tile_rows); ++col) {
            const bool left = col < cut;
            const uint64_t offset = (left ? r * cut + col : r * (cols - cut) + col - cut) * 4;
            expected[c.files[left ? 0 : 1]->file().get()].push_back({offset, offset + 4});
          }
      }
    empty += expected.empty();
    ASSERT_EQ(merged(got), merged(expected)) << "range [" << first << ", +" << count << ")";
  }
  EXPECT_GT(empty, 10);
  EXPECT_LT(empty, 190);
}

}  // namespace
}  // namespace ckptfs::catalog
