// What each key of a Megatron torch_dist DCP dir holds. A key is the model's only when it is neither
// optimizer nor run state: megatron-core's ChainedOptimizer (a MoE model's dense and expert optimizers)
// prefixes its sub-optimizers' keys with `chained_{i}.` (the distributed optimizer's per-domain buffers
// always, model-space state in saves before `chained_optim_avoid_prefix`), which no plain prefix test
// on "optimizer." catches.
#pragma once

#include <string_view>
#include <variant>

namespace ckptfs::megatron {

struct ModelKey {
  std::string_view name;  // the parameter's (stacked) name
};
struct MasterKey {
  std::string_view name;  // an fp32 master saved under its parameter's name (model space)
};
struct BucketedOptimizerKey {};  // the distributed optimizer's per-domain state (optimizer.distributed.*)
struct OtherOptimizerKey {};     // moments, steps, other state of an optimizer
struct RunStateKey {};           // rng, rerun state machine, common state, _extra_state

using TorchDistKey = std::variant<ModelKey, MasterKey, BucketedOptimizerKey, OtherOptimizerKey, RunStateKey>;

TorchDistKey classify_torch_dist_key(std::string_view fqn);

}  // namespace ckptfs::megatron
