// Partition math against a brute-force reference: every element of every merged parameter is read back
// through the catalog and compared with the value the reference layout put there.
#include "formats/deepspeed/partition_assembly.hpp"

#include <gtest/gtest.h>

#include <random>

#include "catalog/test_sources.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::deepspeed {
namespace {

using testing::float_slice;

std::vector<float> read_all(const catalog::LogicalTensor& t) {
  std::vector<float> out(t.numel());
  catalog::read_tensor(t, 0, std::as_writable_bytes(std::span(out)));
  return out;
}

ModelStates shapes_of(const std::vector<std::vector<uint64_t>>& groups) {
  ModelStates ms;
  ms.path = "mp_rank_00_model_states.pt";
  ms.param_shapes.emplace();
  int k = 0;
  for (const auto& g : groups) {
    ms.param_shapes->emplace_back();
    for (uint64_t n : g)
      ms.param_shapes->back().push_back({"p" + std::to_string(k++), {static_cast<int64_t>(n)}, n});
  }
  return ms;
}

TEST(DeepSpeedPartition, FlatGroupsMatchBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const uint64_t ranks = 1 + rng() % 8;
    std::vector<std::vector<uint64_t>> groups(1 + rng() % 3);
    for (auto& g : groups)
      for (int i = 0, n = 1 + rng() % 5; i < n; ++i) g.push_back(1 + rng() % 40);
    ModelStates ms = shapes_of(groups);
    // Reference layout: group g's flat vector padded to 2*ranks, split evenly, value = 1000*g + element.
    // Every rank's partition is stored in one file behind some unrelated leading bytes (a prefix view).
    std::vector<float> data(3, -1.0f);
    std::vector<OptimStates> optim(ranks);
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> slices(ranks);
    for (size_t g = 0; g < groups.size(); ++g) {
      uint64_t total = 0;
      for (uint64_t n : groups[g]) total += n;
      const uint64_t aligned = (total + 2 * ranks - 1) / (2 * ranks) * (2 * ranks);
      const uint64_t slice = aligned / ranks;
      for (uint64_t r = 0; r < ranks; ++r) {
        const uint64_t first = data.size();
        for (uint64_t i = 0; i < slice; ++i) {
          const uint64_t e = r * slice + i;
          data.push_back(e < total ? static_cast<float>(1000 * g + e) : -7.0f);
        }
        // The last rank stores its slice without padding, as ZeRO-1/2 does.
        const uint64_t stored = r + 1 == ranks ? total - std::min(total, r * slice) : slice;
        slices[r].push_back({first, stored});
      }
    }
    const auto file = testing::SourceFile::of(data);
    for (uint64_t r = 0; r < ranks; ++r) {
      optim[r].path = "rank" + std::to_string(r);
      for (auto [first, count] : slices[r]) optim[r].fp32_groups.push_back(float_slice(file, first, count));
    }
    auto tensors = assemble_flat_groups(ms, optim);
    size_t k = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      uint64_t offset = 0;
      for (uint64_t n : groups[g]) {
        auto values = read_all(tensors[k++]);
        ASSERT_EQ(values.size(), n);
        for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(values[i], static_cast<float>(1000 * g + offset + i));
        offset += n;
      }
    }
  }
}

TEST(DeepSpeedPartition, Zero3ParametersMatchBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const uint64_t ranks = 1 + rng() % 8;
    std::vector<std::vector<uint64_t>> groups(1 + rng() % 3);
    for (auto& g : groups)
      for (int i = 0, n = 1 + rng() % 5; i < n; ++i) g.push_back(1 + rng() % 30);
    ModelStates ms = shapes_of(groups);
    // Param k (global index) element e has value 1000*k + e; rank r holds [r*p, (r+1)*p) of each param.
    std::vector<float> data;
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans(ranks);
    for (uint64_t r = 0; r < ranks; ++r) {
      int k = 0;
      for (const auto& g : groups) {
        const uint64_t first = data.size();
        for (uint64_t n : g) {
          const uint64_t p = (n + ranks - 1) / ranks;
          for (uint64_t i = 0; i < p; ++i) {
            const uint64_t e = r * p + i;
            data.push_back(e < n ? static_cast<float>(1000 * k + e) : -9.0f);
          }
          ++k;
        }
        spans[r].push_back({first, data.size() - first});
      }
    }
    const auto file = testing::SourceFile::of(data);
    std::vector<OptimStates> optim(ranks);
    for (uint64_t r = 0; r < ranks; ++r) {
      optim[r].path = "rank" + std::to_string(r);
      for (auto [first, count] : spans[r]) optim[r].fp32_groups.push_back(float_slice(file, first, count));
    }
    auto tensors = assemble_zero3_groups(ms, optim);
    int k = 0;
    for (const auto& g : groups)
      for (uint64_t n : g) {
        auto values = read_all(tensors[k]);
        ASSERT_EQ(values.size(), n);
        for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(values[i], static_cast<float>(1000 * k + i));
        ++k;
      }
  }
}

TEST(DeepSpeedPartition, ShapesThatDoNotAddUpAreRejected) {
  std::vector<float> data(64, 0.0f);
  const auto file = testing::SourceFile::of(data);
  ModelStates ms = shapes_of({{10, 10}});
  std::vector<OptimStates> optim(2);
  optim[0].fp32_groups = {float_slice(file, 0, 10)};
  optim[1].fp32_groups = {float_slice(file, 10, 10)};
  EXPECT_NO_THROW(assemble_flat_groups(ms, optim));
  ms.param_shapes->front().push_back({"extra", {5}, 5});
  EXPECT_THROW(assemble_flat_groups(ms, optim), FormatError);
  EXPECT_THROW(assemble_zero3_groups(ms, optim), FormatError);
}

}  // namespace
}  // namespace ckptfs::deepspeed
