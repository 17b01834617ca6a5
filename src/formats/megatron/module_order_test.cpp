#include "formats/megatron/module_order.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ckptfs::megatron {
namespace {

std::vector<std::string> sorted_names(std::vector<std::string> names) {
  std::vector<catalog::LogicalTensor> tensors;
  for (auto& n : names) {
    catalog::LogicalTensor t;
    t.name = std::move(n);
    tensors.push_back(std::move(t));
  }
  sort_into_module_order(tensors);
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(t.name);
  return out;
}

// The order of a local-spec GPTModel's named_parameters(), as the real megatron-core 0.18.2 torch_dist
// fixture's .metadata lists it at DP 1, given shuffled as a DP 2 save's .metadata can list it.
TEST(ModuleOrder, RestoresNamedParametersOrder) {
  const std::vector<std::string> model = {
      "embedding.word_embeddings.weight",
      "decoder.layers.0.input_layernorm.weight",
      "decoder.layers.0.self_attention.linear_proj.weight",
      "decoder.layers.0.self_attention.linear_qkv.weight",
      "decoder.layers.0.pre_mlp_layernorm.weight",
      "decoder.layers.0.mlp.linear_fc1.weight",
      "decoder.layers.0.mlp.linear_fc2.weight",
      "decoder.layers.10.input_layernorm.weight",
      "decoder.final_layernorm.weight",
      "output_layer.weight",
  };
  EXPECT_EQ(sorted_names({model[6], model[9], model[3], model[7], model[0], model[8], model[2], model[5],
                          model[1], model[4]}),
            model);
}

TEST(ModuleOrder, TransformerEngineAndExperts) {
  const std::vector<std::string> te = {
      "decoder.layers.0.self_attention.linear_proj.weight",
      "decoder.layers.0.self_attention.linear_proj.bias",
      "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
      "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias",
      "decoder.layers.0.self_attention.linear_qkv.weight",
      "decoder.layers.0.self_attention.q_layernorm.weight",
      "decoder.layers.0.mlp.router.weight",
      "decoder.layers.0.mlp.experts.linear_fc1.weight2",
      "decoder.layers.0.mlp.experts.linear_fc1.weight10",
      "decoder.layers.0.mlp.experts.linear_fc2.weight0",
      "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
  };
  EXPECT_EQ(sorted_names({te[10], te[9], te[8], te[7], te[6], te[5], te[4], te[3], te[2], te[1], te[0]}), te);
  EXPECT_LT(*module_order_key("decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight"),
            *module_order_key("decoder.layers.1.mlp.experts.local_experts.10.linear_fc1.weight"));
}

TEST(ModuleOrder, UnknownModulesKeepTheGivenOrder) {
  EXPECT_FALSE(module_order_key("decoder.layers.0.self_attention.linear_q_down_proj.weight"));
  EXPECT_FALSE(module_order_key("mtp.layers.0.enorm.weight"));
  EXPECT_FALSE(module_order_key("decoder.layers.x.input_layernorm.weight"));
  const std::vector<std::string> given = {"output_layer.weight", "mtp.layers.0.enorm.weight",
                                          "embedding.word_embeddings.weight"};
  EXPECT_EQ(sorted_names(given), given);
}

}  // namespace
}  // namespace ckptfs::megatron
