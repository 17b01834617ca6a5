// The optimizer state a DeepSpeed tag contributes to its universal checkpoint (docs/formats/universal.md):
// per trainable parameter its moments and step, and the global optimizer state of zero/optimizer_state.pt.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/checkpoint.hpp"
#include "ckptfs/pickle.hpp"
#include "formats/deepspeed/state_files.hpp"

namespace ckptfs::deepspeed {

// Optimizer state of the trainable parameters, aligned with the fp32 masters they were assembled with.
struct OptimizerState {
  std::vector<std::string> keys;  // per-parameter state besides fp32: exp_avg, exp_avg_sq
  std::vector<std::vector<catalog::LogicalTensor>> tensors;  // [param][key]
  std::vector<pickle::ValuePtr> steps;                       // [param]: its group's step; null when none
};

// The per-parameter state of one MP rank's optimizer files, for the masters `assemble_flat_groups` /
// `assemble_zero3_groups` built from the same files, in the same order. Returns nullopt (and says why in
// `why_not`) when the files hold no usable per-parameter state (an elastic checkpoint, no Adam moments).
std::optional<OptimizerState> read_optimizer_state(const ModelStates& shapes_file,
                                                   const std::vector<OptimStates>& ranks, bool zero3,
                                                   std::string& why_not);

// zero/optimizer_state.pt as ds_to_universal writes it from the DP-rank-0 file (`rank0`, of a run over
// `world_size` ranks): ZeRO-0/1/2 keep the global keys only, ZeRO-3 the whole inner state; both add
// `param_groups`. Tensors become catalog::tensor_value handles into `tensors`, which it fills.
pickle::ValuePtr universal_optimizer_state(const OptimStates& rank0, int64_t world_size, bool zero3,
                                           std::shared_ptr<catalog::Catalog> tensors);

}  // namespace ckptfs::deepspeed
