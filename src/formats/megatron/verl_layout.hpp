// verl's Megatron backend (volcengine/verl verl/utils/checkpoint/megatron_checkpoint_manager.py,
// verl/utils/megatron_utils.py get_*_checkpoint_path):
//
//   <run dir>/latest_checkpointed_iteration.txt              the last step (verl's tracker:
//   str(global_steps)) <run dir>/global_step_N/actor/dist_ckpt/                 Megatron's torch_dist save of
//   the model, optimizer and
//                                                            rng state (no Megatron args in its common state)
//   <run dir>/global_step_N/actor/transformer_config.json   rank 0's dump of the model's megatron-core
//                                                            TransformerConfig (callables dropped)
//   <run dir>/global_step_N/actor/huggingface/               the HF config.json and tokenizer files
//   <run dir>/global_step_N/critic/...                       the critic, the same way
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::megatron {

// The files a verl role dir keeps the model's config in: TransformerConfig's dump and the HF config
// (vocabulary, positions, rope base, tied embeddings and activation: the GPTModel arguments verl takes from
// it).
struct VerlModelConfig {
  std::filesystem::path transformer_config, hf_config;
};

std::filesystem::path verl_dist_ckpt(const std::filesystem::path& role);
std::filesystem::path verl_huggingface(const std::filesystem::path& role);

// A role dir of verl's Megatron backend: dist_ckpt/ a torch_dist dir, transformer_config.json or huggingface/
// beside it.
bool is_verl_megatron_role(const io::Source& source, const std::filesystem::path& dir);
// The role dirs of a step dir, the actor first, then the others in natural order.
std::vector<std::filesystem::path> verl_megatron_roles(const io::Source& source,
                                                       const std::filesystem::path& step);
// The global_step_N dirs of a run dir that hold a role, in natural order.
std::vector<std::filesystem::path> verl_megatron_steps(const io::Source& source,
                                                       const std::filesystem::path& run);

// The HF config fields verl builds megatron-core's GPTModel with (verl/models/mcore/model_initializer.py,
// config_converter.py): vocab_size unpadded, max_position_embeddings, rope_theta (or rope_parameters'),
// tie_word_embeddings (PretrainedConfig's default true), hidden_act. Throws FormatError naming the file when
// it is not JSON or a field is missing or of the wrong type (exit 4).
struct HfModelConfig {
  int64_t vocab_size = 0, max_positions = 0;
  double rope_theta = 10000;
  bool tied_embeddings = true;
  std::string activation = "silu";
};
HfModelConfig read_hf_model_config(const io::Source& source, const std::filesystem::path& config_json);

// The config files of the role whose dist_ckpt/ `dir` is, when it is one with transformer_config.json beside
// it.
std::optional<VerlModelConfig> verl_model_config_of(const io::Source& source,
                                                    const std::filesystem::path& dir);

}  // namespace ckptfs::megatron
