#include "formats/megatron/stacked_tensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "catalog/test_sources.hpp"

namespace ckptfs::megatron {
namespace {

using testing::SourceFile;

// fully_sharded_model_space's reformulated master of a [4, 6] tensor split into 2 x 3 fragments of [2, 2]:
// stored [2, 3, 4], each fragment's row its local shard flattened, cut into two DCP chunks at `cut` (two DP
// ranks' ranges).
struct Flattened {
  std::vector<std::unique_ptr<SourceFile>> files;
  catalog::LogicalTensor stored;
};

float model_value(int64_t i, int64_t j) {
  return static_cast<float>(i * 6 + j) + 0.25f;
}

Flattened flattened(int64_t cut) {
  Flattened out;
  std::vector<catalog::Box> boxes;
  for (int64_t f0 = 0; f0 < 2; ++f0)
    for (int64_t f1 = 0; f1 < 3; ++f1)
      for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, cut}, {cut, 4}}) {
        std::vector<float> values;
        for (int64_t k = lo; k < hi; ++k) values.push_back(model_value(f0 * 2 + k / 2, f1 * 2 + k % 2));
        out.files.push_back(std::make_unique<SourceFile>(std::as_bytes(std::span(values))));
        catalog::Box b;
        b.offsets = {f0, f1, lo};
        b.sizes = {1, 1, hi - lo};
        b.source.storage = {out.files.back()->file(), 0, values.size() * 4};
        b.source.dtype = DType::F32;
        b.source.shape = b.sizes;
        b.source.strides = {hi - lo, hi - lo, 1};
        boxes.push_back(std::move(b));
      }
  out.stored =
      catalog::assembled_tensor("optimizer.state.fp32_param.w", DType::F32, {2, 3, 4}, std::move(boxes), "");
  return out;
}

TEST(UnflattenFragments, PutsEachFragmentBackInPlace) {
  for (int64_t cut : {1, 2, 3}) {
    const Flattened f = flattened(cut);
    const auto model = unflatten_fragments(f.stored, {4, 6});
    ASSERT_TRUE(model.has_value());
    EXPECT_EQ(model->shape, (std::vector<int64_t>{4, 6}));
    std::vector<float> got(24);
    catalog::read_tensor(*model, 0, std::as_writable_bytes(std::span(got)));
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 6; ++j)
        EXPECT_EQ(got[i * 6 + j], model_value(i, j)) << i << "," << j << " cut " << cut;
    // the layers of a stacked master come from the unflattened tensor, as the model's do
    const auto row = stacked_entry(*model, 3, "w3");
    std::vector<float> third(6);
    catalog::read_tensor(row, 0, std::as_writable_bytes(std::span(third)));
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(third[j], model_value(3, j));
  }
}

TEST(UnflattenFragments, OnlyTensorsOneDimensionLongerThatDivide) {
  const Flattened f = flattened(2);
  EXPECT_FALSE(unflatten_fragments(f.stored, {4, 6, 1}).has_value());  // same rank: a model-shaped master
  EXPECT_FALSE(unflatten_fragments(f.stored, {5, 6}).has_value());     // 5 rows do not split in 2
  EXPECT_FALSE(unflatten_fragments(f.stored, {4, 9}).has_value());     // local [2, 3]: 6 elements, not 4
}

}  // namespace
}  // namespace ckptfs::megatron
