// The one table of Hugging Face model families ckptfs knows: each family's parameters (names, shapes,
// registration order, tied aliases) as transformers' *ForCausalLM classes create them. Megatron's hf/ takes
// its state-dict order from it; FSDP's flat parameters are cut by it (docs/formats/fsdp-per-rank.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::formats {

enum class HfFamily { llama, qwen2, gpt2, qwen3, qwen3_moe, mixtral, qwen2_moe };

std::string_view architecture_name(HfFamily family);  // "LlamaForCausalLM", ...
std::string_view model_type(HfFamily family);         // config.json's model_type: "llama", ...

// The sizes a family's parameter shapes follow, as config.json names them for that family.
struct HfDims {
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t positions = 0;                          // GPT-2's learned position table
  bool tied = false;                              // tie_word_embeddings: lm_head.weight is embed's parameter
  bool attention_bias = false, mlp_bias = false;  // Llama's flags (Qwen2: q/k/v biases only; Qwen3: q/k/v/o)
  int64_t experts = 0, moe_intermediate = 0;      // the MoE families' routed experts
  int64_t shared_intermediate = 0;  // Qwen2-MoE's gated shared expert (shared_expert_intermediate_size)
  // Qwen2/3-MoE's layers with a dense MLP of `intermediate` (mlp_only_layers, decoder_sparse_step), ascending
  std::vector<int64_t> dense_layers = {};
};

struct HfParameter {
  std::string name;
  std::vector<int64_t> shape;
  std::string tied_to;  // non-empty: the same parameter as this earlier one (lm_head.weight of a tied model)
};

struct HfLayout {
  HfFamily family;
  HfDims dims;
  // Every parameter in the model's registration order (module.named_parameters(remove_duplicate=False)).
  std::vector<HfParameter> parameters;
};

// The layout a config.json describes (its architectures' one entry, or without architectures its
// model_type's causal LM), or why there is none (an architecture not in the table: a string naming it).
// Throws FormatError naming the file when it is not JSON or a field the family needs is missing or not a
// positive integer (exit 4).
std::variant<HfLayout, std::string> layout_from_config(const io::Source& source,
                                                       const std::filesystem::path& config_json);

// The config.json files that describe the model of a tag, first first: -o config=FILE, the tag dir's, the
// save dir's.
std::vector<std::filesystem::path> config_files(const OpenOptions& options,
                                                const std::filesystem::path& tag_dir,
                                                const std::filesystem::path& root);

// The layout the first existing file of `configs` describes, or why there is none (no config.json, another
// architecture, a field missing: layout_from_config's message).
std::variant<HfLayout, std::string> layout_in(const io::Source& source,
                                              const std::vector<std::filesystem::path>& configs);

// The layout of `family` with `dims`.
HfLayout layout_of(HfFamily family, const HfDims& dims);

// The family's state-dict order of names for a model of any depth: names outside the layers with "" where the
// layers go, and a layer's names after its prefix ("model.layers.{}.", see layer_prefix).
struct HfNameOrder {
  std::vector<std::string> model, layer;
};
HfNameOrder name_order(HfFamily family);
std::string layer_prefix(HfFamily family);  // "model.layers.{}." / "transformer.h.{}."

}  // namespace ckptfs::formats
