// NeMo-RL's checkpoint dir around Megatron-Bridge saves (NVIDIA-NeMo/RL nemo_rl/utils/checkpoint.py,
// models/policy/workers/megatron_policy_worker.py, algorithms/grpo.py):
//
//   <checkpoint_dir>/step_N/training_info.json, config.yaml   NeMo-RL's own state and the run's config
//   <checkpoint_dir>/step_N/policy/weights/                     a Megatron-Bridge save dir (iter_0000000/
//   ...) <checkpoint_dir>/step_N/policy/tokenizer/                   the HF tokenizer (save_pretrained)
//
// A step is written as tmp_step_N/ and renamed to step_N/ once complete, so a step_N/ dir is always whole.
#pragma once

#include <filesystem>
#include <functional>
#include <vector>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::megatron {

// The policy's weights dir of a NeMo-RL step dir.
std::filesystem::path nemo_rl_weights(const std::filesystem::path& step);
// The policy's tokenizer dir of a NeMo-RL step dir.
std::filesystem::path nemo_rl_tokenizer(const std::filesystem::path& step);

// The step_N dirs of a NeMo-RL checkpoint dir whose policy/weights/ `is_weights` accepts, in natural order
// (tmp_step_N and old_step_N, mid-save, are not steps).
std::vector<std::filesystem::path> nemo_rl_steps(
    const io::Source& source, const std::filesystem::path& dir,
    const std::function<bool(const std::filesystem::path&)>& is_weights);

}  // namespace ckptfs::megatron
