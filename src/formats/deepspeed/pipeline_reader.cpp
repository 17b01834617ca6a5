// Pipeline tags: `module` is None in every stage's model states and the weights sit in layer_XX-model_00
// files, one per layer (docs/formats/deepspeed.md).
#include <fmt/format.h>

#include <set>
#include <string_view>
#include <unordered_map>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/rank_files.hpp"

namespace ckptfs::deepspeed {

namespace {

// DeepSpeed >= 0.18.5 saves a ZeRO-0 pipeline's BF16_Optimizer without param_shapes: the flat groups' params
// are the names of the optimizer files' param_slice_mappings (every DP rank's, in order), shaped as the
// layer files hold them.
std::vector<std::vector<NamedShape>> shapes_from_slice_mappings(const std::vector<OptimStates>& optim,
                                                                const std::vector<NamedTensor>& module) {
  std::unordered_map<std::string_view, const NamedTensor*> by_name;
  for (const auto& e : module) by_name.emplace(e.name, &e);
  std::vector<std::vector<NamedShape>> groups(optim.front().slice_names.size());
  for (const auto& rank : optim) {
    if (rank.slice_names.size() != groups.size())
      throw FormatError(fmt::format("{}: param_slice_mappings lists {} groups, DP rank 0's file {}",
                                    rank.path.string(), rank.slice_names.size(), groups.size()));
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const auto& name : rank.slice_names[g]) {
        if (!groups[g].empty() && groups[g].back().name == name) continue;  // a param split across ranks
        auto it = by_name.find(name);
        if (it == by_name.end())
          throw FormatError(fmt::format("{}: param_slice_mappings names {}, which no layer file holds",
                                        rank.path.string(), name));
        const auto& shape = it->second->tensor.shape;
        groups[g].push_back({name, shape, it->second->tensor.numel()});
      }
    }
  }
  return groups;
}

}  // namespace

TagParts read_pipeline(io::FileSet& files, const TagFiles& tf, DeepSpeedTopology& topo,
                       std::vector<std::string>& notes) {
  for (const auto& [layer, tps] : tf.layer_states)
    if (tps.size() > 1 || tps.begin()->first != 0)
      throw FormatError(fmt::format("{}: the layer files of tensor-parallel rank {} without those of rank 0",
                                    tps.rbegin()->second.string(), tps.rbegin()->first));
  TagParts parts;
  // Without partitioned optimizer state (ZeRO-0 with a torch optimizer) the fp32 view is the upcast weights.
  parts.masters_known = !tf.optim_states.empty();
  std::vector<std::pair<ModelStates, std::vector<OptimStates>>> stages;
  std::set<std::string> known;  // param and buffer names: they tell tied layers' prefixes
  for (const auto& [mp, path] : tf.model_states) {
    auto& [ms, optim] = stages.emplace_back(read_model_states(files, path), std::vector<OptimStates>{});
    if (parts.masters_known) optim = read_optim_ranks(files, tf, mp);
    parts.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
    if (ms.param_shapes)
      for (const auto& group : *ms.param_shapes)
        for (const auto& p : group) known.insert(p.name);
    for (const auto& rank : optim)
      for (const auto& group : rank.slice_names) known.insert(group.begin(), group.end());
    if (mp == tf.model_states.begin()->first) parts.aliases = ms.shared_params;
  }
  known.insert(parts.buffers.begin(), parts.buffers.end());
  for (const auto& [layer, tps] : tf.layer_states) {
    auto entries = read_state_dict(files, tps.begin()->second);
    const std::string prefix = layer_prefix(layer, entries, known);
    for (auto& e : entries) parts.module.push_back({prefix + e.name, std::move(e.tensor)});
  }
  for (auto& [ms, optim] : stages) {
    if (!parts.masters_known) {
      topo.dp = static_cast<int>(ms.dp_world_size.value_or(1));
      topo.optimizer = "none (optimizer state inside model states)";
      continue;
    }
    if (!ms.param_shapes && !optim.front().slice_names.empty())
      ms.param_shapes = shapes_from_slice_mappings(optim, parts.module);
    add_flat_stage(ms, optim, topo, parts);
  }
  topo.pp = static_cast<int>(tf.model_states.size());
  notes.push_back(
      "pipeline layers are named as PipelineModule names them ({layer}.{key}, tied_modules.{key}.{key})");
  return parts;
}

}  // namespace ckptfs::deepspeed
