// DeepSpeed checkpoints (ZeRO-0/1/2/3, BF16_Optimizer, pipeline parallel): detection and indexing.
#pragma once

#include <filesystem>
#include <string>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"

namespace ckptfs::deepspeed {

// True when `root` (as `source` reads it) is a DeepSpeed save dir (a `latest` file or tag dirs with model
// states) or a tag dir.
bool is_deepspeed_source(const io::Source& source, const std::filesystem::path& root);

Checkpoint open(const io::Source& source, const std::filesystem::path& root, const OpenOptions& options);

// Indexes one tag directory: validates every rank file and builds the fp32 and model catalogs.
Tag read_tag(io::FileSet& files, const std::filesystem::path& dir, const std::string& name);

}  // namespace ckptfs::deepspeed
