// verl (volcengine/verl) FSDP checkpoints, FSDPCheckpointManager's layout for FSDP1 and FSDP2: detection
// and indexing of a save dir, one global_step_N dir or one role dir (docs/formats/verl.md).
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::verl {

// True when `root` (as `source` reads it) is a role dir (model_world_size_W_rank_R.pt files: actor/,
// critic/), a global_step_N dir holding role dirs, or a save dir holding global_step_N dirs
// (latest_checkpointed_iteration.txt).
bool is_verl_source(const io::Source& source, const std::filesystem::path& root);

Checkpoint open(const io::Source& source, const std::filesystem::path& root, const OpenOptions& options);

}  // namespace ckptfs::verl
