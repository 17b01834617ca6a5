#include "formats/hf_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "ckptfs/error.hpp"
#include "formats/name_prefix.hpp"
#include "io/test_source.hpp"
#include "torch/test_support.hpp"

namespace ckptfs::formats {
namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

HfDims llama_dims() {
  return {.vocab = 131,
          .hidden = 32,
          .intermediate = 72,
          .layers = 2,
          .heads = 4,
          .kv_heads = 2,
          .head_dim = 8,
          .positions = 0,
          .tied = false,
          .attention_bias = false,
          .mlp_bias = false};
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
  HfDims d = llama_dims();  // GPT-2's sizes: head_dim = hidden / heads, learned positions, a tied head
  d.vocab = 50;
  d.hidden = 8;
  d.intermediate = 32;
  d.layers = 1;
  d.heads = d.kv_heads = 2;
  d.head_dim = 4;
  d.positions = 16;
  d.tied = true;
  const auto layout = layout_of(HfFamily::gpt2, d);
  EXPECT_EQ(layout.parameters[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(layout.parameters[4].shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(layout.parameters[12].name, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(layout.parameters[12].shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(layout.parameters.back().tied_to, "transformer.wte.weight");
}

TEST(HfLayout, NameOrderListsEveryOptionalName) {
  const auto order = name_order(HfFamily::llama);
  EXPECT_EQ(order.model, (std::vector<std::string>{"model.embed_tokens.weight", "", "model.norm.weight",
                                                   "lm_head.weight"}));
  EXPECT_EQ(order.layer[1], "self_attn.q_proj.bias");
}

// Qwen3Attention (transformers 5.12 modeling_qwen3.py) registers q_norm and k_norm, RMSNorms of one head
// (head_dim may differ from hidden / heads), after o_proj.
TEST(HfLayout, Qwen3NormsQueriesAndKeysPerHead) {
  auto d = llama_dims();
  d.head_dim = 24;
  const auto layout = layout_of(HfFamily::qwen3, d);
  EXPECT_EQ(layout.parameters[1].shape, (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(layout.parameters[4].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(layout.parameters[5].name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(layout.parameters[5].shape, (std::vector<int64_t>{24}));
  EXPECT_EQ(layout.parameters[6].name, "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(layout.parameters[7].name, "model.layers.0.mlp.gate_proj.weight");
}

// transformers 5 fuses a sparse block's experts into 3-D parameters: Qwen3MoeSparseMoeBlock registers
// experts (gate_up_proj [E, 2 x moe_intermediate, hidden], down_proj [E, hidden, moe_intermediate]) then
// gate; MixtralSparseMoeBlock gate first.
TEST(HfLayout, MoeExpertsFusedAsTransformersCreatesThem) {
  auto d = llama_dims();
  d.experts = 8;
  d.moe_intermediate = 16;
  const auto qwen = layout_of(HfFamily::qwen3_moe, d);
  EXPECT_EQ(qwen.parameters[7].name, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(qwen.parameters[7].shape, (std::vector<int64_t>{8, 32, 32}));
  EXPECT_EQ(qwen.parameters[8].name, "model.layers.0.mlp.experts.down_proj");
  EXPECT_EQ(qwen.parameters[8].shape, (std::vector<int64_t>{8, 32, 16}));
  EXPECT_EQ(qwen.parameters[9].name, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(qwen.parameters[9].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(qwen.parameters[10].name, "model.layers.0.input_layernorm.weight");
  const auto mixtral = layout_of(HfFamily::mixtral, d);
  EXPECT_EQ(mixtral.parameters[5].name, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(mixtral.parameters[6].name, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(mixtral.parameters[8].name, "model.layers.0.input_layernorm.weight");
}

TEST(HfLayout, Qwen3MoeConfigAsTransformersWritesIt) {
  const torch::test_support::TempFile config(
      R"({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 256, "hidden_size": 48,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 24, "moe_intermediate_size": 32, "num_local_experts": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": []})");
  const auto layout = layout_from_config(*io::test_source(config.path()), config.path());
  ASSERT_TRUE(std::holds_alternative<HfLayout>(layout)) << std::get<std::string>(layout);
  const auto& l = std::get<HfLayout>(layout);
  EXPECT_EQ(l.family, HfFamily::qwen3_moe);
  EXPECT_EQ(l.dims.experts, 8);
  EXPECT_EQ(l.parameters.size(),
            1 + 2 * 11 + 2U);  // embed, 2 x (4 projections, 2 head norms, 3 MoE, 2 norms), norm, head
}

// Qwen3MoeDecoderLayer: a dense Qwen3MoeMLP of intermediate_size in the layers of mlp_only_layers and, with
// decoder_sparse_step n, in every layer l with (l + 1) % n != 0.
TEST(HfLayout, Qwen3MoeDenseLayersFromMlpOnlyLayersAndSparseStep) {
  const auto layout_with = [](const std::string& fields) {
    const torch::test_support::TempFile config(
        R"({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 256, "hidden_size": 48,
      "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "moe_intermediate_size": 32,
      "num_experts": 8, )" +
        fields + "}");
    return layout_from_config(*io::test_source(config.path()), config.path());
  };
  const auto listed = layout_with(R"("mlp_only_layers": [3, 0])");
  ASSERT_TRUE(std::holds_alternative<HfLayout>(listed)) << std::get<std::string>(listed);
  const auto& l = std::get<HfLayout>(listed);
  EXPECT_EQ(l.dims.dense_layers, (std::vector<int64_t>{0, 3}));
  const auto named = [&](const std::string& name) {
    return std::ranges::find(l.parameters, name, &HfParameter::name) != l.parameters.end();
  };
  EXPECT_TRUE(named("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(named("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(named("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(named("model.layers.1.mlp.gate_proj.weight"));
  EXPECT_TRUE(named("model.layers.3.mlp.down_proj.weight"));
  const auto dense_down =
      std::ranges::find(l.parameters, "model.layers.0.mlp.down_proj.weight", &HfParameter::name);
  EXPECT_EQ(dense_down->shape, (std::vector<int64_t>{48, 96}));
  const auto stepped = layout_with(R"("decoder_sparse_step": 2, "mlp_only_layers": [1])");
  ASSERT_TRUE(std::holds_alternative<HfLayout>(stepped));
  EXPECT_EQ(std::get<HfLayout>(stepped).dims.dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_THROW(layout_with(R"("mlp_only_layers": [4])"), FormatError);
  EXPECT_THROW(layout_with(R"("mlp_only_layers": 1)"), FormatError);
}

// Qwen2MoeForCausalLM: q/k/v biases (qkv_bias, on by default), the sparse block's gate, experts, shared
// expert (a SwiGLU MLP of shared_expert_intermediate_size) and its [1, hidden] gate; num_experts, not
// num_local_experts.
TEST(HfLayout, Qwen2MoeSharedExpertAsTransformersCreatesIt) {
  const torch::test_support::TempFile config(
      R"({"architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 256, "hidden_size": 48,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 40, "num_experts": 8,
    "mlp_only_layers": [1]})");
  const auto layout = layout_from_config(*io::test_source(config.path()), config.path());
  ASSERT_TRUE(std::holds_alternative<HfLayout>(layout)) << std::get<std::string>(layout);
  const auto& l = std::get<HfLayout>(layout);
  EXPECT_EQ(l.family, HfFamily::qwen2_moe);
  std::vector<std::string> layer0;
  for (const auto& p : l.parameters)
    if (p.name.starts_with("model.layers.0.")) layer0.push_back(p.name.substr(15));
  EXPECT_EQ(layer0, (std::vector<std::string>{
                        "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                        "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                        "self_attn.o_proj.weight", "mlp.gate.weight", "mlp.experts.gate_up_proj",
                        "mlp.experts.down_proj", "mlp.shared_expert.gate_proj.weight",
                        "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
                        "mlp.shared_expert_gate.weight", "input_layernorm.weight",
                        "post_attention_layernorm.weight"}));
  const auto gate =
      std::ranges::find(l.parameters, "model.layers.0.mlp.shared_expert_gate.weight", &HfParameter::name);
  EXPECT_EQ(gate->shape, (std::vector<int64_t>{1, 48}));
  const auto shared = std::ranges::find(l.parameters, "model.layers.0.mlp.shared_expert.down_proj.weight",
                                        &HfParameter::name);
  EXPECT_EQ(shared->shape, (std::vector<int64_t>{48, 40}));
  EXPECT_NE(std::ranges::find(l.parameters, "model.layers.1.mlp.gate_proj.weight", &HfParameter::name),
            l.parameters.end());
}

// The state-dict order of names of a family with sparse and dense layers holds both kinds' names, each kind
// in its own order (hf/ of Megatron sorts by it).
TEST(HfNameOrder, MoeFamiliesOrderSparseAndDenseLayersAlike) {
  auto d = llama_dims();
  d.experts = 4;
  d.moe_intermediate = 16;
  d.dense_layers = {1};
  const auto order = name_order(HfFamily::qwen3_moe).layer;
  const auto layout = layout_of(HfFamily::qwen3_moe, d);
  for (const std::string layer : {"model.layers.0.", "model.layers.1."}) {
    size_t last = 0;
    for (const auto& p : layout.parameters) {
      if (!p.name.starts_with(layer)) continue;
      const auto at = std::ranges::find(order, p.name.substr(layer.size()));
      ASSERT_NE(at, order.end()) << p.name;
      EXPECT_GE(static_cast<size_t>(at - order.begin()), last) << p.name;
      last = static_cast<size_t>(at - order.begin());
    }
  }
}

TEST(NamePrefix, FoundAgainstTheArchitecturesNamesAndModules) {
  const auto layout = layout_of(HfFamily::llama, llama_dims());
  EXPECT_EQ(layout_prefix({"model.model.embed_tokens.weight", "model.lm_head.weight"}, layout), "model.");
  EXPECT_EQ(layout_prefix({"_forward_module.model.model.layers.0.mlp.up_proj.weight"}, layout),
            "_forward_module.model.");
  EXPECT_EQ(layout_prefix({"module.model.layers.1"}, layout), "module.");
  EXPECT_EQ(layout_prefix({"model.layers.1", "lm_head.weight"}, layout), "");
  EXPECT_EQ(layout_prefix({"decoder.layers.0.self_attention.linear_qkv.weight"}, layout), std::nullopt);
}

}  // namespace
}  // namespace ckptfs::formats
