// FSDP's per-rank saves: a folder of every rank's torch.save of its state dict (FSDP1 LOCAL_STATE_DICT flat
// parameters as ShardedTensors, FSDP2 or FSDP1-with-mesh DTensors), under any naming (rank{R}.pt,
// accelerate's pytorch_model_fsdp_rank{R}.bin beside its optimizer_0/), or a folder of such step dirs (HF
// Trainer's checkpoint-N/): detection and indexing (docs/formats/fsdp-per-rank.md).
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::fsdp {

// True when `root` (as `source` reads it), or a subdir of it, holds per-rank files (NAME{R}.pt with "rank"
// before R) whose rank-0 file holds DTensors or ShardedTensors, or cannot be read (refused by open, naming
// it).
bool is_fsdp_source(const io::Source& source, const std::filesystem::path& root);

Checkpoint open(const io::Source& source, const std::filesystem::path& root, const OpenOptions& options);

}  // namespace ckptfs::fsdp
