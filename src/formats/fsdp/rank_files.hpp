// The per-rank model files of one FSDP save, found by name: every rank's torch.save of its state dict named
// with its rank ("rank{R}.pt", accelerate's "pytorch_model_fsdp_rank{R}.bin" and
// "pytorch_model_fsdp_{I}_rank{R}.bin", "model_world_size_{W}_rank_{R}.pt", ...). Which groups hold a
// model is decided by their content (formats/fsdp/fsdp_checkpoint.cpp).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::formats::fsdp {

struct RankFiles {
  std::string pattern;                       // "rank{R}.pt": the files' names, for messages
  std::string stem;                          // the name before the rank ("pytorch_model_fsdp_1_rank")
  std::vector<std::filesystem::path> files;  // by rank, 0 .. W-1
};

// The groups of rank files of `dir` (names with "rank" before the number that ends them: NAME{R}.pt, .pth,
// .bin), the shortest stem first (accelerate's first model, then pytorch_model_fsdp_{I}_rank). Throws
// FormatError naming the missing file when a group lacks a rank below its highest.
std::vector<RankFiles> rank_file_groups(const io::Source& source, const std::filesystem::path& dir);

// Whether `dir` holds such files (a cheap look at names, for detection).
bool has_rank_files(const io::Source& source, const std::filesystem::path& dir);

}  // namespace ckptfs::formats::fsdp
