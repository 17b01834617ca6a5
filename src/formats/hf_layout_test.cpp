#include "formats/hf_layout.hpp"

#include <gtest/gtest.h>

#include "formats/name_prefix.hpp"

namespace ckptfs::formats {
namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

HfDims llama_dims() {
  return {.vocab = 131, .hidden = 32, .intermediate = 72, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 8,
          .positions = 0, .tied = false, .attention_bias = false, .mlp_bias = false};
}

// The real FSDP1 save of mount_tests/fixtures/fsdp-local-real/fsdp1_llama_ws2_fp32_flat: its root unit holds
// 8,416 elements (embed 131x32 + norm 32 + lm_head 131x32), each decoder layer 10,048.
TEST(HfLayout, LlamaParametersInRegistrationOrder) {
  const auto layout = layout_of(HfFamily::llama, llama_dims());
  ASSERT_EQ(layout.parameters.size(), 21U);
  EXPECT_EQ(layout.parameters.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(layout.parameters[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(layout.parameters[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(layout.parameters.back().name, "lm_head.weight");
  int64_t layer = 0;
  for (const auto& p : layout.parameters)
    if (p.name.starts_with("model.layers.0.")) layer += numel(p.shape);
  EXPECT_EQ(layer, 10048);
  EXPECT_EQ(numel(layout.parameters.front().shape) + 32 + numel(layout.parameters.back().shape), 8416);
}

TEST(HfLayout, QwenTiesItsHeadAndBiasesQkvOnly) {
  auto d = llama_dims();
  d.tied = true;
  const auto layout = layout_of(HfFamily::qwen2, d);
  EXPECT_EQ(layout.parameters.back().tied_to, "model.embed_tokens.weight");
  EXPECT_EQ(layout.parameters[2].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(layout.parameters[7].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(layout.parameters[8].name, "model.layers.0.mlp.gate_proj.weight");
}

TEST(HfLayout, Gpt2Conv1DWeightsAreInputByOutput) {
  const HfDims d{.vocab = 50, .hidden = 8, .intermediate = 32, .layers = 1, .heads = 2, .kv_heads = 2, .head_dim = 4,
                 .positions = 16, .tied = true, .attention_bias = false, .mlp_bias = false};
  const auto layout = layout_of(HfFamily::gpt2, d);
  EXPECT_EQ(layout.parameters[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(layout.parameters[4].shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(layout.parameters[12].name, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(layout.parameters[12].shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(layout.parameters.back().tied_to, "transformer.wte.weight");
}

TEST(HfLayout, NameOrderListsEveryOptionalName) {
  const auto order = name_order(HfFamily::llama);
  EXPECT_EQ(order.model, (std::vector<std::string>{"model.embed_tokens.weight", "", "model.norm.weight", "lm_head.weight"}));
  EXPECT_EQ(order.layer[1], "self_attn.q_proj.bias");
}

TEST(NamePrefix, FoundAgainstTheArchitecturesNamesAndModules) {
  const auto layout = layout_of(HfFamily::llama, llama_dims());
  EXPECT_EQ(layout_prefix({"model.model.embed_tokens.weight", "model.lm_head.weight"}, layout), "model.");
  EXPECT_EQ(layout_prefix({"_forward_module.model.model.layers.0.mlp.up_proj.weight"}, layout), "_forward_module.model.");
  EXPECT_EQ(layout_prefix({"module.model.layers.1"}, layout), "module.");
  EXPECT_EQ(layout_prefix({"model.layers.1", "lm_head.weight"}, layout), "");
  EXPECT_EQ(layout_prefix({"decoder.layers.0.self_attention.linear_qkv.weight"}, layout), std::nullopt);
}

}  // namespace
}  // namespace ckptfs::formats
