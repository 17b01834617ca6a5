// Reads the per-rank files of one MP rank and checks that they form one consistent set: ranks 0..N-1
// all present, every file agreeing on the data-parallel world size.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "formats/deepspeed/state_files.hpp"
#include "formats/deepspeed/tag_files.hpp"

namespace ckptfs::deepspeed {

// Optimizer files of MP rank `mp`, indexed by DP rank.
std::vector<OptimStates> read_optim_ranks(io::FileSet& files, const TagFiles& tf, int mp);

// ZeRO-3 model-state files of MP rank `mp`, indexed by DP rank.
std::vector<ModelStates> read_zero3_model_ranks(io::FileSet& files, const TagFiles& tf, int mp);

// The name prefix of a pipeline layer file's keys: "tied_modules.<key>." when its keys match a tied
// module's names in param_shapes / buffer_names (`known`), else "<layer>.".
std::string layer_prefix(int layer, const std::vector<NamedTensor>& entries,
                         const std::set<std::string>& known);

}  // namespace ckptfs::deepspeed
