// Checkpoint dirs of safetensors files, as PyTorch's HuggingFaceStorageWriter (torch.distributed.checkpoint
// .hf_storage, torchtitan's HF save) writes them: distributed shards with DCP_SHARDING_INFO, the
// consolidated files beside sharded/, or a rank-0 save of full tensors (docs/formats/dcp.md, "Hugging Face
// storage").
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"

namespace ckptfs::dcp {

// True when `dir` is a directory holding *.safetensors files, at its top level (what
// HuggingFaceStorageReader reads) or in sharded/ (distributed shards whose consolidation never ran).
bool is_hf_storage_dir(const std::filesystem::path& dir);

// One tag named after the dir: model.safetensors and fp32/ of every tensor, each merged from the chunks its
// files hold (offsets from DCP_SHARDING_INFO, else the whole tensor); the dir's other regular files
// (model.safetensors.index.json, config.json, ...) served as side files.
Checkpoint open_hf_storage(const std::filesystem::path& dir, const OpenOptions& options);

}  // namespace ckptfs::dcp
