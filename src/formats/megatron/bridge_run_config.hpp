// Megatron-Bridge and NeMo 2 keep no Megatron `args` in their saves: the model's config is the `model:`
// section of Bridge's iter_N/run_config.yaml (the model provider's dataclass, GPTModelProvider and its
// subclasses) or the `config:` section of NeMo 2's context/model.yaml (the model's fiddle config, GPTConfig
// and its subclasses, written by IOMixin.io_dump with its defaults), both dumped as YAML under
// megatron-core's TransformerConfig names (num_moe_experts, gated_linear_unit, ...). verl's Megatron backend
// dumps the same dataclass as JSON (transformer_config.json).
#pragma once

#include <filesystem>

#include "ckptfs/io_tree.hpp"
#include "formats/megatron/model_args.hpp"

namespace ckptfs::megatron {

constexpr const char* kBridgeRunConfig = "run_config.yaml";

// The model's sizes and options from `run_config` (read with yaml-cpp). Throws FormatError naming the file
// and the field when it is not YAML, has no `model:` mapping, or a field ckptfs needs is missing or of the
// wrong type (exit 4).
ModelArgs read_bridge_model_config(const io::Source& source, const std::filesystem::path& run_config);
// The same from the `config:` mapping of NeMo 2's context/model.yaml.
ModelArgs read_nemo_model_config(const io::Source& source, const std::filesystem::path& model_yaml);
// The same from verl's transformer_config.json (the whole file is the mapping) and, for what GPTModel takes
// beside its TransformerConfig, the role's huggingface/config.json (formats/megatron/verl_layout.hpp).
ModelArgs read_verl_model_config(const io::Source& source, const std::filesystem::path& transformer_config,
                                 const std::filesystem::path& hf_config);

}  // namespace ckptfs::megatron
