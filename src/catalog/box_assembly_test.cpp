// Box assemblies (DCP chunks, tensor-parallel slices) read against a brute-force reference: every
// element of the logical tensor looked up box by box, with sources in any stride order.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "catalog/test_sources.hpp"
#include "ckptfs/catalog.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::catalog {
namespace {

using testing::SourceFile;

// A grid of boxes over `shape`: each dimension cut at `cuts[d]`; every box's source stores its
// elements in a random permutation of the dimension order (a transposed or permuted dense tensor).
struct GridCase {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> cuts;  // per dimension, interior cut points
};

struct Built {
  std::vector<std::unique_ptr<SourceFile>> files;
  LogicalTensor tensor;
  std::vector<float> expected;  // logical row-major values
};

Built build(const GridCase& c, std::mt19937& rng, bool permuted = true) {
  Built out;
  const size_t dims = c.shape.size();
  const uint64_t numel = std::accumulate(c.shape.begin(), c.shape.end(), uint64_t{1},
                                         [](uint64_t a, int64_t b) { return a * static_cast<uint64_t>(b); });
  out.expected.resize(numel);
  for (uint64_t i = 0; i < numel; ++i) out.expected[i] = static_cast<float>(i) + 0.5f;
  std::vector<std::vector<int64_t>> edges(dims);
  for (size_t d = 0; d < dims; ++d) {
    edges[d] = {0};
    for (int64_t x : c.cuts[d]) edges[d].push_back(x);
    edges[d].push_back(c.shape[d]);
  }
  std::vector<Box> boxes;
  std::vector<size_t> cell(dims, 0);
  while (true) {
    Box b;
    for (size_t d = 0; d < dims; ++d) {
      b.offsets.push_back(edges[d][cell[d]]);
      b.sizes.push_back(edges[d][cell[d] + 1] - edges[d][cell[d]]);
    }
    // source layout: dimensions stored in a random order
    std::vector<size_t> order(dims);
    std::iota(order.begin(), order.end(), 0);
    if (permuted) std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> strides(dims);
    int64_t stride = 1;
    for (size_t k = dims; k-- > 0;) {
      strides[order[k]] = stride;
      stride *= std::max<int64_t>(b.sizes[order[k]], 1);
    }
    const uint64_t n = std::accumulate(b.sizes.begin(), b.sizes.end(), uint64_t{1},
                                       [](uint64_t a, int64_t s) { return a * static_cast<uint64_t>(s); });
    std::vector<float> storage(n + 3, -1.0f);  // 3 leading elements: a storage offset
    std::vector<int64_t> local(dims, 0);
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t logical = 0, src = 3;
      for (size_t d = 0; d < dims; ++d) {
        logical =
            logical * static_cast<uint64_t>(c.shape[d]) + static_cast<uint64_t>(b.offsets[d] + local[d]);
        src += static_cast<uint64_t>(local[d] * strides[d]);
      }
      storage[src] = out.expected[logical];
      for (size_t d = dims; d-- > 0;) {
        if (++local[d] < b.sizes[d]) break;
        local[d] = 0;
      }
    }
    out.files.push_back(std::make_unique<SourceFile>(std::as_bytes(std::span(storage))));
    b.source.storage = {out.files.back()->file(), 0, storage.size() * 4};
    b.source.dtype = DType::F32;
    b.source.shape = b.sizes;
    b.source.strides = strides;
    b.source.storage_offset = 3;
    boxes.push_back(std::move(b));
    size_t d = dims;
    while (d > 0 && ++cell[d - 1] == edges[d - 1].size() - 1) {
      cell[d - 1] = 0;
      --d;
    }
    if (d == 0) break;
  }
  out.tensor.name = "t";
  out.tensor.shape = c.shape;
  out.tensor.source = Boxed{std::make_shared<BoxAssembly>("t", c.shape, std::move(boxes))};
  validate(out.tensor);
  return out;
}

void expect_reads_match(const Built& b, std::mt19937& rng) {
  const uint64_t nbytes = b.tensor.nbytes();
  std::vector<std::byte> all(nbytes);
  read_tensor(b.tensor, 0, all);
  ASSERT_EQ(std::memcmp(all.data(), b.expected.data(), nbytes), 0);
  for (int i = 0; i < 50 && nbytes > 0; ++i) {  // random byte ranges, unaligned ends included
    const uint64_t off = rng() % nbytes, len = 1 + rng() % (nbytes - off);
    std::vector<std::byte> part(len);
    read_tensor(b.tensor, off, part);
    ASSERT_EQ(std::memcmp(part.data(), reinterpret_cast<const std::byte*>(b.expected.data()) + off, len), 0)
        << "bytes [" << off << ", " << off + len << ")";
  }
}

TEST(BoxAssembly, GridsOfAnyShapeReadLikeTheReference) {
  std::mt19937 rng(7);
  const std::vector<GridCase> cases = {
      {{8, 6}, {{4}, {}}},    // Shard(0) over 2
      {{5, 37}, {{}, {19}}},  // Shard(1), uneven
      {{6, 10}, {{3}, {5}}},  // 2-D mesh
      {{4, 3, 5}, {{1, 3}, {2}, {1, 4}}},
      {{7}, {{2, 3, 6}}},
      {{1, 9}, {{}, {3, 6}}},
      {{}, {}},  // a scalar
  };
  for (const auto& c : cases) {
    for (int repeat = 0; repeat < 4; ++repeat) {
      SCOPED_TRACE(::testing::Message() << "shape rank " << c.shape.size() << " repeat " << repeat);
      expect_reads_match(build(c, rng), rng);
    }
  }
}

TEST(BoxAssembly, ColumnSplitNeedsOneRunPerRowPerBoxNotPerElement) {
  std::mt19937 rng(1);
  const Built b = build({{64, 64}, {{}, {32}}}, rng, false);
  std::vector<Piece> runs;
  std::get<Boxed>(b.tensor.source).assembly->plan(0, 64 * 64, runs);
  EXPECT_EQ(runs.size(), 128u);
  EXPECT_EQ(runs[0].count, 32u);
  runs.clear();  // a row split (Shard(0)) is one run per box
  std::get<Boxed>(build({{64, 64}, {{32}, {}}}, rng, false).tensor.source).assembly->plan(0, 64 * 64, runs);
  EXPECT_EQ(runs.size(), 2u);
}

TEST(BoxAssembly, OverlapsHolesAndOutOfBoundsAreErrors) {
  SourceFile f = SourceFile::of(std::vector<float>(16, 1.0f));
  const auto box = [&](std::vector<int64_t> off, std::vector<int64_t> size) {
    Box b;
    b.offsets = off;
    b.sizes = size;
    b.source.storage = {f.file(), 0, 64};
    b.source.shape = size;
    b.source.strides = {size.size() > 1 ? size[1] : 1, 1};
    b.source.strides.resize(size.size());
    return b;
  };
  const auto error = [&](std::vector<Box> boxes) {
    try {
      BoxAssembly("w", {4, 4}, std::move(boxes));
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({box({0, 0}, {4, 4}), box({2, 0}, {2, 4})}).find("overlap"), std::string::npos);
  EXPECT_NE(error({box({0, 0}, {2, 4})}).find("the elements at [2, 0] are in no chunk"), std::string::npos);
  EXPECT_NE(error({box({0, 0}, {4, 4}), box({3, 3}, {2, 2})}).find("outside"), std::string::npos);
  EXPECT_EQ(error({box({0, 0}, {4, 4}), box({0, 0}, {0, 4})}), "");  // an empty chunk is fine
}

}  // namespace
}  // namespace ckptfs::catalog
