// Checkpoint dirs of safetensors files, as PyTorch's HuggingFaceStorageWriter (torch.distributed.checkpoint
// .hf_storage, torchtitan's HF save) writes them: distributed shards with DCP_SHARDING_INFO, the
// consolidated files beside sharded/, or a rank-0 save of full tensors (docs/formats/dcp.md, "Hugging Face
// storage").
#pragma once

#include <filesystem>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"

namespace ckptfs::dcp {

// True when `dir` is a directory holding *.safetensors files, at its top level (what
// HuggingFaceStorageReader reads) or in sharded/ (distributed shards whose consolidation never ran).
bool is_hf_storage_dir(const io::Source& source, const std::filesystem::path& dir);

// The tag of such a dir: model.safetensors and fp32/ of every tensor, each merged from the chunks its files
// hold (offsets from DCP_SHARDING_INFO, else the whole tensor); the dir's other regular files
// (model.safetensors.index.json, config.json, ...) as its side files. Also a step dir of a DCP folder
// (torchtitan's last step saved in HF format beside DCP steps).
Tag read_hf_storage_tag(io::FileSet& files, const std::filesystem::path& dir, const std::string& name);

// `dir` as SRC: its one tag, named after it.
Checkpoint open_hf_storage(const io::Source& source, const std::filesystem::path& dir,
                           const OpenOptions& options);

}  // namespace ckptfs::dcp
