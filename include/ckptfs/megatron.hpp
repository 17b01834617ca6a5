// Megatron-LM checkpoints (also NeMo's and Megatron-DeepSpeed's without the DeepSpeed engine): detection
// and indexing of a save dir or one iteration dir (docs/formats/megatron.md).
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::megatron {

// True when `root` (as `source` reads it) is a Megatron save dir (latest_checkpointed_iteration.txt, or
// iter_*/release dirs in the legacy or torch_dist layout) or one such iteration dir.
bool is_megatron_source(const io::Source& source, const std::filesystem::path& root);

Checkpoint open(const io::Source& source, const std::filesystem::path& root, const OpenOptions& options);

}  // namespace ckptfs::megatron
