#include "formats/megatron/torch_dist_keys.hpp"

#include <algorithm>

#include "formats/megatron/state_names.hpp"

namespace ckptfs::megatron {

namespace {

// Where the non-distributed optimizer (and the distributed one's fully reshardable and, flattened,
// fully_sharded_model_space layouts) keep fp32 masters under the model's keys.
constexpr std::string_view kMasterPrefixes[] = {"optimizer.state.fp32_param.", "optimizer.state.param."};
constexpr std::string_view kRunState[] = {"rng_state", "rerun_state_machine", "common_state"};

// Drops ChainedOptimizer's "chained_<digits>." from the front of `key`; whether there was one.
bool drop_chained_prefix(std::string_view& key) {
  constexpr std::string_view kChained = "chained_";
  if (!key.starts_with(kChained)) return false;
  const std::string_view rest = key.substr(kChained.size());
  const size_t digits = static_cast<size_t>(
      std::find_if(rest.begin(), rest.end(), [](char c) { return c < '0' || c > '9'; }) - rest.begin());
  if (digits == 0 || digits >= rest.size() || rest[digits] != '.') return false;
  key = rest.substr(digits + 1);
  return true;
}

}  // namespace

TorchDistKey classify_torch_dist_key(std::string_view fqn) {
  std::string_view key = fqn;
  const bool chained = drop_chained_prefix(key);
  for (auto prefix : kMasterPrefixes)
    if (key.starts_with(prefix)) return MasterKey{key.substr(prefix.size())};
  if (key.starts_with("optimizer.distributed.")) return BucketedOptimizerKey{};
  if (chained || key.starts_with("optimizer.")) return OtherOptimizerKey{};
  for (auto prefix : kRunState)
    if (key.starts_with(prefix)) return RunStateKey{};
  if (is_extra_state(key)) return RunStateKey{};
  return ModelKey{key};
}

}  // namespace ckptfs::megatron
