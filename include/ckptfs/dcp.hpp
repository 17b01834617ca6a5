// PyTorch Distributed Checkpoints (torch.distributed.checkpoint: FSDP, FSDP2, torchtitan, accelerate):
// detection and indexing (docs/formats/dcp.md).
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::dcp {

// True when `root` (as `source` reads it) is a DCP dir (.metadata), a checkpoint folder holding DCP dirs
// (accelerate's pytorch_model_fsdp_0/ + optimizer_0/) or a folder of such step dirs (step-N, checkpoint-N,
// ...), where a step dir may also be a HuggingFaceStorageWriter dir (formats/dcp/hf_storage.hpp).
bool is_dcp_source(const io::Source& source, const std::filesystem::path& root);

Checkpoint open(const io::Source& source, const std::filesystem::path& root, const OpenOptions& options);

}  // namespace ckptfs::dcp
