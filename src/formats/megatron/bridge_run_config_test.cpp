#include "formats/megatron/bridge_run_config.hpp"

#include <gtest/gtest.h>

#include "ckptfs/error.hpp"
#include "io/test_source.hpp"
#include "torch/test_support.hpp"

namespace ckptfs::megatron {
namespace {

// A run_config.yaml whose model: section is `model` (indented by two).
torch::test_support::TempFile run_config(const std::string& model) {
  return torch::test_support::TempFile(
      "_target_: megatron.bridge.training.config.ConfigContainer\nmodel:\n" + model, "run_config.yaml");
}

constexpr const char* kQwen3Moe = R"(  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  num_query_groups: 2
  kv_channels: 24
  ffn_hidden_size: 96
  vocab_size: 250
  seq_length: 128
  tensor_model_parallel_size: 2
  make_vocab_size_divisible_by: 128
  num_moe_experts: 8
  moe_ffn_hidden_size: 32
  moe_grouped_gemm: true
  gated_linear_unit: true
  activation_func:
    _call_: false
    _target_: torch.nn.functional.silu
  qk_layernorm: true
  share_embeddings_and_output_weights: false
  bf16: true
)";

TEST(BridgeRunConfig, ModelSectionAsMegatronArgs) {
  const auto config =
      run_config(std::string(kQwen3Moe) + "  should_pad_vocab: true\n" +
                 "  transformer_impl: transformer_engine\n  transformer_layer_spec:\n    _call_: false\n"
                 "    _target_: megatron.bridge.models.gpt_provider.local_layer_spec\n");
  const ModelArgs a = read_bridge_model_config(*io::test_source("/"), config.path());
  EXPECT_EQ(a.tp, 2);
  EXPECT_EQ(a.padded_vocab, 256);  // 250 up to a multiple of 128 x TP 2
  EXPECT_EQ(a.vocab, 250);
  EXPECT_EQ(a.num_experts, 8);
  EXPECT_EQ(a.moe_ffn_hidden, 32);
  EXPECT_TRUE(a.swiglu);
  EXPECT_TRUE(a.qk_layernorm);
  EXPECT_FALSE(a.tied_embeddings);
  EXPECT_EQ(a.params_dtype, DType::BF16);
  // Bridge's local layer spec: SequentialMLP experts whatever moe_grouped_gemm says
  EXPECT_TRUE(a.local_spec);
  EXPECT_FALSE(a.moe_grouped_gemm);
}

TEST(BridgeRunConfig, TransformerEngineSpecKeepsGroupedExperts) {
  const auto config = run_config(std::string(kQwen3Moe) + "  transformer_impl: transformer_engine\n");
  const ModelArgs a = read_bridge_model_config(*io::test_source("/"), config.path());
  EXPECT_FALSE(a.local_spec);
  EXPECT_TRUE(a.moe_grouped_gemm);
  EXPECT_EQ(a.padded_vocab, 250);  // should_pad_vocab absent: no padding
}

TEST(BridgeRunConfig, WrongFieldsNameTheFileAndField) {
  const auto config = run_config("  num_layers: two\n");
  try {
    read_bridge_model_config(*io::test_source("/"), config.path());
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(config.path().string() + ": model.num_layers: expected an integer"),
              std::string::npos)
        << e.what();
  }
}

// moe_layer_freq as Bridge's dataclass holds it: an int (every n-th layer) or a list (a 0 or 1 per layer);
// the string form Megatron evaluates as Python is refused, never evaluated
TEST(BridgeRunConfig, MoeLayerFrequencyAsIntOrList) {
  const ModelArgs every_second = read_bridge_model_config(
      *io::test_source("/"), run_config(std::string(kQwen3Moe) + "  moe_layer_freq: 2\n").path());
  EXPECT_EQ(every_second.moe_layer_pattern, (std::vector<int>{1, 0}));
  EXPECT_FALSE(every_second.moe_every_layer);
  const ModelArgs listed = read_bridge_model_config(
      *io::test_source("/"),
      run_config(std::string(kQwen3Moe) + "  moe_layer_freq: [0, 1]\n  moe_shared_expert_gate: true\n")
          .path());
  EXPECT_EQ(listed.moe_layer_pattern, (std::vector<int>{0, 1}));
  EXPECT_TRUE(listed.moe_shared_gate);
  for (const char* freq : {"\"([0]+[1]*1)\"", "[1, 1, 1]", "0"}) {
    const auto config = run_config(std::string(kQwen3Moe) + "  moe_layer_freq: " + freq + "\n");
    try {
      read_bridge_model_config(*io::test_source("/"), config.path());
      ADD_FAILURE() << freq << ": no error";
    } catch (const FormatError& e) {
      EXPECT_NE(
          std::string(e.what()).find(": model.moe_layer_freq: expected a positive integer or a list of 2"),
          std::string::npos)
          << e.what();
    }
  }
}

// NeMo 2's context/model.yaml: the model's fiddle config, its GPTConfig under config:
TEST(NemoModelYaml, ConfigSectionAsMegatronArgs) {
  const torch::test_support::TempFile yaml(
      "_target_: nemo.collections.llm.gpt.model.qwen3.Qwen3Model\n_partial_: false\nconfig:\n" +
          std::string(kQwen3Moe) +
          "  transformer_layer_spec:\n    _call_: false\n"
          "    _target_: nemo.collections.llm.gpt.model.base.local_layer_spec\n"
          "model_transform: null\ntokenizer:\n  _target_: nemo.collections.common.tokenizers.AutoTokenizer\n",
      "model.yaml");
  const ModelArgs a = read_nemo_model_config(*io::test_source("/"), yaml.path());
  EXPECT_EQ(a.tp, 2);
  EXPECT_EQ(a.padded_vocab, 250);  // NeMo's vocab_size is the embedding's: no should_pad_vocab
  EXPECT_EQ(a.num_experts, 8);
  EXPECT_TRUE(a.local_spec);
  EXPECT_TRUE(a.qk_layernorm);
}

TEST(NemoModelYaml, MissingConfigOrFieldNamesTheFile) {
  const torch::test_support::TempFile no_config("_target_: nemo.collections.llm.gpt.model.base.GPTModel\n",
                                                "model.yaml");
  EXPECT_THROW(
      {
        try {
          read_nemo_model_config(*io::test_source("/"), no_config.path());
        } catch (const FormatError& e) {
          EXPECT_NE(std::string(e.what()).find(no_config.path().string() + ": no config: mapping (NeMo 2"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      FormatError);
  const torch::test_support::TempFile no_layers("config:\n  hidden_size: 64\n", "model.yaml");
  try {
    read_nemo_model_config(*io::test_source("/"), no_layers.path());
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(": config.num_layers: missing: NeMo 2 saves"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ckptfs::megatron
