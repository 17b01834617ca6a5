// Assembly math against a brute-force reference: every byte read through the catalog is compared with the
// byte computed element by element from the source files' contents.
#include "ckptfs/catalog.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "catalog/test_sources.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::catalog {
namespace {

using testing::read_syscalls;
using testing::SourceFile;
namespace ref = testing::reference;

LogicalTensor make_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                          std::vector<Piece> pieces = {}) {
  LogicalTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.source = FlatRuns{std::move(pieces)};
  return t;
}

std::vector<std::byte> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// The served bytes of one element, computed from the source bytes with the test's own conversions.
void reference_element(const Piece& p, uint64_t index, DType to, const std::vector<std::byte>& file,
                       std::byte* out) {
  const size_t in_size = dtype_size(p.src_dtype);
  const std::byte* in = file.data() + p.src_offset + index * in_size;
  uint32_t w32 = 0;
  uint16_t w16 = 0;
  if (p.src_dtype == to) return (void)std::memcpy(out, in, in_size);
  if (to == DType::F32) {
    std::memcpy(&w16, in, 2);
    w32 = p.src_dtype == DType::F16 ? ref::f16_to_f32(w16) : ref::bf16_to_f32(w16);
    return (void)std::memcpy(out, &w32, 4);
  }
  std::memcpy(&w32, in, 4);
  w16 = to == DType::F16 ? ref::f32_to_f16(w32) : ref::f32_to_bf16(w32);
  std::memcpy(out, &w16, 2);
}

std::vector<std::byte> reference_bytes(const LogicalTensor& t,
                                       const std::map<const io::File*, const SourceFile*>& files) {
  std::vector<std::byte> out(t.nbytes());
  const size_t size = dtype_size(t.dtype);
  for (const Piece& p : std::get<FlatRuns>(t.source).pieces)
    for (uint64_t i = 0; i < p.count; ++i)
      reference_element(p, i, t.dtype, files.at(p.file.get())->bytes(),
                        out.data() + (p.dst_begin + i) * size);
  return out;
}

std::vector<std::byte> read_range(const LogicalTensor& t, uint64_t offset, uint64_t length) {
  std::vector<std::byte> out(length);
  read_tensor(t, offset, out);
  return out;
}

DType random_source_dtype(std::mt19937& rng, DType to) {
  if (to == DType::F32) return std::array{DType::F32, DType::F16, DType::BF16}[rng() % 3];
  return rng() % 2 ? to : DType::F32;
}

// A tensor of random shape whose pieces come from random places of the given files, often continuing the
// previous piece in the same file (to exercise coalescing) and with random source dtypes.
LogicalTensor random_tensor(std::mt19937& rng, const std::vector<std::unique_ptr<SourceFile>>& files) {
  LogicalTensor t;
  t.name = "t";
  t.dtype = std::array{DType::F32, DType::F16, DType::BF16, DType::I64}[rng() % 4];
  t.shape = {static_cast<int64_t>(rng() % 40), static_cast<int64_t>(1 + rng() % 50)};
  std::vector<Piece> pieces;
  for (uint64_t e = 0; e < t.numel();) {
    Piece p;
    p.dst_begin = e;
    p.count = std::min<uint64_t>(t.numel() - e, 1 + rng() % (rng() % 4 ? 8 : 300));
    p.src_dtype = t.dtype == DType::I64 ? DType::I64 : random_source_dtype(rng, t.dtype);
    const size_t in_size = dtype_size(p.src_dtype);
    if (!pieces.empty() && rng() % 2 && pieces.back().src_dtype == p.src_dtype) {
      const Piece& last = pieces.back();
      p.file = last.file;
      p.src_offset = last.src_offset + last.count * in_size;
    } else {
      p.file = files[rng() % files.size()]->file();
      p.src_offset = rng() % 64;
    }
    if (p.src_offset + p.count * in_size > p.file->size()) {  // wrap to the file start
      p.src_offset = rng() % 8;
    }
    pieces.push_back(p);
    e += p.count;
  }
  t.source = FlatRuns{std::move(pieces)};
  return t;
}

TEST(Catalog, RandomAssembliesMatchBruteForce) {
  std::mt19937 rng(11);
  std::vector<std::unique_ptr<SourceFile>> files;
  std::map<const io::File*, const SourceFile*> by_file;
  for (int i = 0; i < 3; ++i) {
    files.push_back(std::make_unique<SourceFile>(random_bytes(rng, 20000)));
    by_file[files.back()->file().get()] = files.back().get();
  }
  for (int trial = 0; trial < 200; ++trial) {
    const LogicalTensor t = random_tensor(rng, files);
    ASSERT_NO_THROW(validate(t));
    const auto expected = reference_bytes(t, by_file);
    ASSERT_EQ(read_range(t, 0, t.nbytes()), expected);
    for (int r = 0; r < 30 && t.nbytes() > 0; ++r) {
      const uint64_t offset = rng() % (t.nbytes() + 1);
      const uint64_t length = rng() % (t.nbytes() - offset + 1);
      ASSERT_EQ(read_range(t, offset, length),
                std::vector<std::byte>(expected.begin() + offset, expected.begin() + offset + length))
          << "trial " << trial << " offset " << offset << " length " << length;
    }
  }
}

TEST(Catalog, ConcurrentReadsWithConversionAgree) {
  std::mt19937 rng(5);
  std::vector<std::unique_ptr<SourceFile>> files;
  std::map<const io::File*, const SourceFile*> by_file;
  files.push_back(std::make_unique<SourceFile>(random_bytes(rng, 200000)));
  by_file[files.back()->file().get()] = files.back().get();
  std::vector<LogicalTensor> tensors;
  for (int i = 0; i < 8; ++i) tensors.push_back(random_tensor(rng, files));
  std::vector<std::vector<std::byte>> expected;
  for (const auto& t : tensors) expected.push_back(reference_bytes(t, by_file));
  std::atomic<int> mismatches = 0;
  std::vector<std::thread> threads;
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&, k] {
      std::mt19937 local(k);
      for (int r = 0; r < 300; ++r) {
        const size_t i = local() % tensors.size();
        const uint64_t n = tensors[i].nbytes();
        const uint64_t offset = local() % (n + 1), length = local() % (n - offset + 1);
        if (read_range(tensors[i], offset, length) !=
            std::vector<std::byte>(expected[i].begin() + offset, expected[i].begin() + offset + length))
          ++mismatches;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, 0);
}

TEST(Catalog, ConversionLargerThanScratchBuffer) {
  std::vector<uint16_t> values(3 << 20);  // 6 MiB of f16, more than one 4 MiB scratch chunk
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(i * 2654435761u >> 16);
  SourceFile src = SourceFile::of(values);
  LogicalTensor t = make_tensor("big", DType::F32, {static_cast<int64_t>(values.size())},
                                {{0, values.size(), src.file(), 0, DType::F16}});
  std::vector<uint32_t> out(values.size());
  read_tensor(t, 0, std::as_writable_bytes(std::span(out)));
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(out[i], ref::f16_to_f32(values[i])) << i;
}

// A strided source: element i of the storage holds value i (int32).
struct Strided {
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
};

std::vector<int32_t> row_major_values(const Strided& s) {
  std::vector<int32_t> out;
  uint64_t n = 1;
  for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
  for (uint64_t e = 0; e < n; ++e) {
    int64_t address = s.offset;
    uint64_t rest = e;
    for (size_t d = s.shape.size(); d-- > 0;) {
      address += static_cast<int64_t>(rest % static_cast<uint64_t>(s.shape[d])) * s.strides[d];
      rest /= static_cast<uint64_t>(s.shape[d]);
    }
    out.push_back(static_cast<int32_t>(address));
  }
  return out;
}

class CatalogStrided : public ::testing::Test {
 protected:
  CatalogStrided() : storage_(SourceFile::of(iota(4096))) {}
  static std::vector<int32_t> iota(int n) {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = i;
    return v;
  }
  torch::SourceTensor tensor(const Strided& s) const {
    torch::SourceTensor t;
    // The storage sits 8 bytes into the file (element 2), so offsets are checked against the span.
    t.storage = {storage_.file(), 8, storage_.file()->size() - 8};
    t.dtype = DType::I32;
    t.shape = s.shape;
    t.strides = s.strides;
    t.storage_offset = s.offset;
    return t;
  }
  std::vector<int32_t> read(const LogicalTensor& t) const {
    std::vector<int32_t> out(t.numel());
    read_tensor(t, 0, std::as_writable_bytes(std::span(out)));
    return out;
  }
  SourceFile storage_;
};

TEST_F(CatalogStrided, EveryLayoutReadsInRowMajorOrder) {
  const std::vector<std::pair<Strided, size_t>> cases = {
      {{{4, 6}, {6, 1}, 3}, 1},               // contiguous: one piece
      {{{4, 3}, {6, 1}, 1}, 4},               // column slice: one run per row
      {{{6, 4}, {1, 6}, 0}, 24},              // transposed: one element per run
      {{{2, 1, 3, 5}, {40, 7, 5, 1}, 2}, 2},  // size-1 dim with an odd stride is ignored
      {{{3, 4}, {0, 1}, 5}, 3},               // expanded (stride 0) rows
      {{{5}, {2}, 0}, 5},                     // every other element
      {{{}, {}, 17}, 1},                      // 0-dim
      {{{3, 0, 2}, {0, 2, 1}, 0}, 0},         // zero-size
      {{{2, 3, 4}, {12, 4, 1}, 100}, 1},
      {{{2, 3, 4}, {24, 4, 1}, 0}, 2},  // contiguous inner box, gap between outer slices
  };
  for (const auto& [s, pieces] : cases) {
    std::vector<Piece> appended;
    append_source_tensor(appended, 0, tensor(s));
    EXPECT_EQ(appended.size(), pieces) << ::testing::PrintToString(s.shape);
    LogicalTensor t = make_tensor("s", DType::I32, s.shape, std::move(appended));
    ASSERT_NO_THROW(validate(t));
    std::vector<int32_t> expected = row_major_values(s);
    for (auto& v : expected) v += 2;  // storage starts at file element 2
    EXPECT_EQ(read(t), expected) << ::testing::PrintToString(s.shape);
  }
}

TEST_F(CatalogStrided, RangesOfStridedSourcesMatchBruteForce) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 300; ++trial) {
    Strided s;
    const int dims = 1 + rng() % 4;
    for (int d = 0; d < dims; ++d) s.shape.push_back(1 + rng() % 5);
    // A random permutation of contiguous strides, sometimes padded (a slice of a larger tensor).
    std::vector<int> perm(dims);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    s.strides.resize(dims);
    int64_t stride = 1 + rng() % 2;
    for (int d : perm) {
      s.strides[d] = stride;
      stride *= s.shape[d] + rng() % 2;
    }
    s.offset = rng() % 10;
    const auto all = row_major_values(s);
    // Split the element range into random consecutive slices appended one after the other, as ZeRO
    // partitions are; the merged pieces must read back as the whole.
    std::vector<Piece> pieces;
    for (uint64_t first = 0; first < all.size();) {
      const uint64_t count = std::min<uint64_t>(all.size() - first, rng() % 7);
      append_source_range(pieces, first, tensor(s), first, count);
      first += count;
    }
    LogicalTensor t = make_tensor("r", DType::I32, {static_cast<int64_t>(all.size())}, std::move(pieces));
    ASSERT_NO_THROW(validate(t));
    std::vector<int32_t> expected = all;
    for (auto& v : expected) v += 2;
    ASSERT_EQ(read(t), expected) << "trial " << trial;
  }
}

TEST_F(CatalogStrided, RangeMergesWithPreviousPiecesAndChecksBounds) {
  const auto src = tensor({{100}, {1}, 0});
  std::vector<Piece> pieces;
  append_source_range(pieces, 0, src, 10, 20);
  append_source_range(pieces, 20, src, 30, 5);  // continues in both spaces: merged
  append_source_range(pieces, 25, src, 50, 5);  // a jump in the source: new piece
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].count, 25u);
  EXPECT_EQ(pieces[0].src_offset, 8u + 40u);
  EXPECT_EQ(pieces[1].src_offset, 8u + 200u);
  EXPECT_THROW(append_source_range(pieces, 30, src, 90, 11), FormatError);
  EXPECT_THROW(append_source_range(pieces, 30, src, 101, 0), FormatError);
  EXPECT_NO_THROW(append_source_range(pieces, 30, src, 100, 0));
  EXPECT_EQ(pieces.size(), 2u);
}

TEST(Catalog, NumelAndTotalBytes) {
  Catalog c;
  c.tensors.push_back(make_tensor("scalar", DType::F64, {}));
  c.tensors.push_back(make_tensor("empty", DType::F32, {3, 0}));
  c.tensors.push_back(make_tensor("m", DType::BF16, {3, 5}));
  EXPECT_EQ(c.tensors[0].numel(), 1u);
  EXPECT_EQ(c.tensors[1].numel(), 0u);
  EXPECT_EQ(c.total_bytes(), 8u + 30u);
}

TEST(Catalog, ValidateNamesWhatIsWrong) {
  SourceFile src = SourceFile::of(std::vector<float>(64));
  const auto tensor = [&](std::vector<Piece> pieces, DType dtype = DType::F32) {
    return make_tensor("layer.w", dtype, {4, 4}, std::move(pieces));
  };
  const auto message = [](const LogicalTensor& t) {
    try {
      validate(t);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto f = src.file();
  EXPECT_EQ(message(tensor({{0, 16, f, 0, DType::F32}})), "no error");
  EXPECT_EQ(message(tensor({{0, 8, f, 0, DType::F32}, {8, 8, f, 0, DType::BF16}})), "no error");
  EXPECT_NE(message(tensor({{0, 8, f, 0, DType::F32}})).find("[8, 16) are not covered"), std::string::npos);
  EXPECT_NE(
      message(tensor({{0, 8, f, 0, DType::F32}, {9, 7, f, 0, DType::F32}})).find("[8, 9) are not covered"),
      std::string::npos);
  EXPECT_NE(message(tensor({{0, 8, f, 0, DType::F32}, {6, 10, f, 0, DType::F32}})).find("covered twice"),
            std::string::npos);
  EXPECT_NE(message(tensor({{0, 16, f, 0, DType::I32}})).find("cannot be served as float32"),
            std::string::npos);
  EXPECT_EQ(message(tensor({{0, 16, f, 0, DType::F32}}, DType::F16)), "no error");
  EXPECT_NE(message(tensor({{0, 16, f, 200, DType::F32}})).find("run past the end"), std::string::npos);
  EXPECT_EQ(message(tensor({})).rfind("tensor layer.w: ", 0), 0u);
}

// A box views its inner tensor's elements through that tensor's runs; a transposed tensor's runs are its
// source's and place no elements, so a box over one is refused when built, naming both tensors.
TEST(Catalog, BoxOverATransposedTensorIsRefused) {
  SourceFile src = SourceFile::of(std::vector<float>(16));
  const auto flat = make_tensor("w", DType::F32, {4, 4}, {{0, 16, src.file(), 0, DType::F32}});
  const auto boxed_over = [](const LogicalTensor& t) {
    auto inner = std::make_shared<const LogicalTensor>(t);
    return assembled_tensor("slice", DType::F32, {4, 4}, {Box{{0, 0}, {4, 4}, element_view(*inner), inner}},
                            "");
  };
  EXPECT_NO_THROW(boxed_over(flat));
  try {
    boxed_over(transposed_tensor("w.T", flat, make_transpose_cache()));
    ADD_FAILURE() << "a box over a transposed tensor was accepted";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              "tensor slice: a box views the transposed tensor w.T, whose runs place no elements");
  }
}

// A box's view of its inner tensor must name only the inner tensor's elements (an index read back from
// disk, the decoder's fuzz target found, could name more: the read then fell short of the tensor).
TEST(Catalog, BoxNamingElementsOutsideItsInnerTensorIsRefused) {
  SourceFile src = SourceFile::of(std::vector<float>(16));
  const auto inner = std::make_shared<const LogicalTensor>(
      make_tensor("w", DType::F32, {4, 4}, {{0, 16, src.file(), 0, DType::F32}}));
  const auto boxed_at = [&](int64_t offset) {
    torch::SourceTensor view = element_view(*inner);
    view.shape = {2, 4};
    view.storage_offset = offset;
    return assembled_tensor("rows", DType::F32, {2, 4}, {Box{{0, 0}, {2, 4}, view, inner}}, "");
  };
  EXPECT_NO_THROW(boxed_at(8));  // the last two rows
  try {
    boxed_at(12);
    ADD_FAILURE() << "a box past its inner tensor's end was accepted";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              "tensor rows: a box names elements outside its inner tensor w (16 elements)");
  }
}

// A stride-0 view repeats one storage element: a few thousand times is served, 2^40 times (a piece per
// element) is refused instead of exhausting memory.
TEST(Catalog, RepeatedElementsAreBounded) {
  SourceFile src = SourceFile::of(std::vector<float>{1.5f, 2.5f});
  torch::SourceTensor t;
  t.storage = {src.file(), 0, 8};
  t.shape = {1000};
  t.strides = {0};
  std::vector<Piece> pieces;
  append_source_tensor(pieces, 0, t);
  EXPECT_EQ(pieces.size(), 1000u);
  t.shape = {int64_t{1} << 40};
  pieces.clear();
  try {
    append_source_tensor(pieces, 0, t);
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(src.path() + ": a tensor view of 1099511627776 elements", 0), 0u)
        << e.what();
  }
}

TEST(Catalog, PiecesBackToBackInOneFileAreOnePread) {
  if (read_syscalls() == 0) GTEST_SKIP() << "/proc/self/io unavailable";
  SourceFile src = SourceFile::of(std::vector<float>(1000, 1.5f));
  std::vector<Piece> pieces;
  for (uint64_t i = 0; i < 1000; i += 10) pieces.push_back({i, 10, src.file(), i * 4, DType::F32});
  const LogicalTensor t = make_tensor("t", DType::F32, {1000}, std::move(pieces));
  std::vector<float> out(1000);
  const uint64_t overhead = [] {
    const uint64_t a = read_syscalls();
    return read_syscalls() - a;
  }();
  const uint64_t before = read_syscalls();
  read_tensor(t, 0, std::as_writable_bytes(std::span(out)));
  EXPECT_EQ(read_syscalls() - before - overhead, 1u);
  EXPECT_EQ(out, std::vector<float>(1000, 1.5f));
}

}  // namespace
}  // namespace ckptfs::catalog
