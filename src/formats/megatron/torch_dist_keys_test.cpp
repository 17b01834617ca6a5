#include "formats/megatron/torch_dist_keys.hpp"

#include <gtest/gtest.h>

namespace ckptfs::megatron {
namespace {

std::string_view model_name(std::string_view fqn) {
  const auto kind = classify_torch_dist_key(fqn);
  return std::holds_alternative<ModelKey>(kind) ? std::get<ModelKey>(kind).name : "<not model>";
}

std::string_view master_name(std::string_view fqn) {
  const auto kind = classify_torch_dist_key(fqn);
  return std::holds_alternative<MasterKey>(kind) ? std::get<MasterKey>(kind).name : "<not a master>";
}

TEST(TorchDistKeys, ModelKeys) {
  EXPECT_EQ(model_name("decoder.layers.mlp.experts.experts.linear_fc1.weight"),
            "decoder.layers.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(model_name("embedding.word_embeddings.weight"), "embedding.word_embeddings.weight");
  // a module whose name merely contains "chained" is the model's
  EXPECT_EQ(model_name("chained_proj.weight"), "chained_proj.weight");
}

TEST(TorchDistKeys, MastersInModelSpace) {
  EXPECT_EQ(master_name("optimizer.state.fp32_param.output_layer.weight"), "output_layer.weight");
  EXPECT_EQ(master_name("optimizer.state.param.output_layer.weight"), "output_layer.weight");
  // a ChainedOptimizer's sub-optimizer in saves before chained_optim_avoid_prefix
  EXPECT_EQ(master_name(
                "chained_1.optimizer.state.fp32_param.decoder.layers.mlp.experts.experts.linear_fc2.weight"),
            "decoder.layers.mlp.experts.experts.linear_fc2.weight");
}

// The silent error of issue 32: a MoE model's distributed optimizer (dp_reshardable) keys, prefixed by
// ChainedOptimizer, were taken for model weights.
TEST(TorchDistKeys, ChainedOptimizerStateIsNeverModel) {
  for (std::string_view fqn :
       {"chained_0.optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
        "torch.float32).bucket_idx_0.param",
        "chained_1.optimizer.distributed.dp_group_idx_1.gbuf_idx_0.dtype_(torch.bfloat16, "
        "torch.float32).bucket_idx_0.exp_avg",
        "chained_12.optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1"})
    EXPECT_TRUE(std::holds_alternative<BucketedOptimizerKey>(classify_torch_dist_key(fqn))) << fqn;
  for (std::string_view fqn :
       {"chained_0.optimizer.state.exp_avg.output_layer.weight", "chained_0.anything.else",
        "optimizer.state.exp_avg_sq.output_layer.weight", "optimizer.param_groups"})
    EXPECT_TRUE(std::holds_alternative<OtherOptimizerKey>(classify_torch_dist_key(fqn))) << fqn;
  EXPECT_TRUE(std::holds_alternative<BucketedOptimizerKey>(
      classify_torch_dist_key("optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
                              "torch.float32).bucket_idx_0.param")));
}

TEST(TorchDistKeys, RunState) {
  for (std::string_view fqn :
       {"rng_state/shard_0.0_1.1", "rerun_state_machine_state/shard_0_2", "common_state/shard_0_1",
        "decoder.layers.self_attention.linear_qkv._extra_state/shard_0_2"})
    EXPECT_TRUE(std::holds_alternative<RunStateKey>(classify_torch_dist_key(fqn))) << fqn;
}

}  // namespace
}  // namespace ckptfs::megatron
