// NeMo 2's checkpoint folder (NVIDIA/NeMo nemo/lightning/ckpt_utils.py WEIGHTS_PATH / CONTEXT_PATH,
// io/mixin.py IOMixin.io_dump, pytorch/strategies/megatron_strategy.py):
//
//   <name>--...-step=N[-last]/weights/              a torch_dist dir (metadata.json, .metadata, __R_S.distcp,
//                                                   common.pt) whose model keys carry MegatronParallel's
//                                                   `module.` prefix
//   <name>--...-step=N[-last]/context/model.yaml    the model's fiddle config: its `config:` the GPTConfig
//   <name>--...-step=N[-last]/context/io.json       the trainer context's fiddle graph
//   <name>--...-step=N[-last]/context/nemo_tokenizer/  the HF tokenizer's files (tokenizer/ in some tools)
//
// The checkpoints dir a run writes holds one such folder per save.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::megatron {

std::filesystem::path nemo2_weights(const std::filesystem::path& checkpoint);
// context/model.yaml of the checkpoint folder that holds `weights` (a dir named weights/).
std::optional<std::filesystem::path> nemo2_model_yaml_of_weights(const io::Source& source,
                                                                 const std::filesystem::path& weights);
// The HF tokenizer dir of a checkpoint folder's context/, if it has one.
std::optional<std::filesystem::path> nemo2_tokenizer(const io::Source& source,
                                                     const std::filesystem::path& checkpoint);

// A NeMo 2 checkpoint folder: weights/ a torch_dist dir, context/ beside it.
bool is_nemo2_checkpoint(const io::Source& source, const std::filesystem::path& dir);
// The NeMo 2 checkpoint folders of a checkpoints dir, in natural order.
std::vector<std::filesystem::path> nemo2_checkpoints(const io::Source& source,
                                                     const std::filesystem::path& dir);

}  // namespace ckptfs::megatron
