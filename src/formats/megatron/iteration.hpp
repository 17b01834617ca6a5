// One Megatron-LM iteration dir (iter_NNNNNNN/ or release/) read into a tag: the legacy layout
// (mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt) or torch_dist (DCP files + common.pt), merged to what
// Megatron holds at TP=1 PP=1 (docs/formats/megatron.md).
#pragma once

#include <filesystem>
#include <string>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"
#include "formats/megatron/model_args.hpp"

namespace ckptfs::megatron {

struct Iteration {
  Tag tag;  // catalogs "model" and (where the checkpoint has masters) "fp32"
  ModelArgs args;
};

bool is_legacy_iteration(const io::Source& source, const std::filesystem::path& dir);  // holds mp_rank_* dirs
bool is_torch_dist_iteration(const io::Source& source,
                             const std::filesystem::path& dir);  // holds metadata.json and .metadata

Iteration read_legacy_iteration(io::FileSet& files, const std::filesystem::path& dir,
                                const std::string& name);
Iteration read_torch_dist_iteration(io::FileSet& files, const std::filesystem::path& dir,
                                    const std::string& name);

}  // namespace ckptfs::megatron
