// The fp32 masters and optimizer state of flat optimizer files (ZeRO-1/2, BF16_Optimizer), read by the
// data-parallel and pipeline readers.
#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/deepspeed/tag_catalogs.hpp"
#include "formats/deepspeed/universal_state.hpp"

namespace ckptfs::deepspeed {

std::string optimizer_name(const OptimStates& rank0) {
  if (!rank0.zero_stage) return "BF16_Optimizer";
  return *rank0.zero_stage == 3 ? "DeepSpeedZeroOptimizer_Stage3" : "DeepSpeedZeroOptimizer";
}

void set_flat_topology(const std::vector<OptimStates>& optim, const ModelStates& ms,
                       DeepSpeedTopology& topo) {
  if (optim.front().zero_stage && *optim.front().zero_stage == 3)
    throw FormatError(fmt::format("{}: ZeRO-3 optimizer state next to a ZeRO-0/1/2 model-state file {}",
                                  optim.front().path.string(), ms.path.filename().string()));
  if (!ms.param_shapes)
    throw FormatError(
        fmt::format("{}: has no param_shapes, but the tag holds ZeRO optimizer files", ms.path.string()));
  topo.dp = static_cast<int>(optim.size());
  topo.optimizer = optimizer_name(optim.front());
  topo.zero_stage = optim.front().zero_stage ? static_cast<int>(*optim.front().zero_stage)
                                             : static_cast<int>(ms.config_zero_stage.value_or(0));
}

void add_flat_stage(const ModelStates& ms, const std::vector<OptimStates>& optim, DeepSpeedTopology& topo,
                    TagParts& parts) {
  set_flat_topology(optim, ms, topo);
  auto masters = assemble_flat_groups(ms, optim);
  const bool first_stage = !parts.optimizer_state;
  std::string why_not;
  auto state = read_optimizer_state(ms, optim, false, why_not);
  if (first_stage) {
    parts.optimizer_state =
        universal_optimizer_state(optim.front(), topo.dp, false, parts.optimizer_state_tensors);
    if (state) parts.optimizer = OptimizerState{state->keys, {}, {}};
  }
  if (!state || (parts.optimizer && parts.optimizer->keys != state->keys)) {
    parts.optimizer.reset();
    if (parts.no_universal.empty())
      parts.no_universal = state ? fmt::format("{}: pipeline stages keep different optimizer state",
                                               optim.front().path.string())
                                 : why_not;
  }
  auto index = index_by_name(parts.trainable);
  for (size_t i = 0; i < masters.size(); ++i) {
    if (!index.emplace(masters[i].name, parts.trainable.size()).second) continue;
    parts.trainable.push_back(std::move(masters[i]));
    if (parts.optimizer) {
      parts.optimizer->tensors.push_back(std::move(state->tensors[i]));
      parts.optimizer->steps.push_back(state->steps[i]);
    }
  }
  parts.model_state_copies.push_back(ms.path);
}

}  // namespace ckptfs::deepspeed
