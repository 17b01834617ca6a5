#include "formats/megatron/model_args.hpp"

#include <gtest/gtest.h>

namespace ckptfs::megatron {
namespace {

// gpt_layer_specs.py: moe_layer_freq n makes layer i an MoE layer when i % n == 0; a list is the pattern
// itself.
TEST(MoeLayerPattern, ExpandsMegatronsMoeLayerFreq) {
  EXPECT_EQ(moe_layer_pattern(int64_t{1}, 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(moe_layer_pattern(int64_t{2}, 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(moe_layer_pattern(std::vector<int64_t>{0, 1, 1}, 3), (std::vector<int>{0, 1, 1}));
}

TEST(MoeLayerPattern, NothingForAFreqMegatronWouldRefuse) {
  EXPECT_TRUE(moe_layer_pattern(int64_t{0}, 3).empty());
  EXPECT_TRUE(moe_layer_pattern(std::vector<int64_t>{1, 0}, 3).empty());  // not one per layer
  EXPECT_TRUE(moe_layer_pattern(std::vector<int64_t>{1, 2, 1}, 3).empty());
}

}  // namespace
}  // namespace ckptfs::megatron
