// Builds the catalogs of one DeepSpeed tag (docs/formats/deepspeed.md, Views) and its universal plan:
//   fp32:  buffers (float ones upcast), frozen params (upcast), trainable fp32 masters, tied aliases;
//   model: the weights in the training dtype, in `module` (or pipeline layer) order.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "formats/deepspeed/model_state_masters.hpp"
#include "formats/deepspeed/moe_experts.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/deepspeed/rank_files.hpp"
#include "formats/deepspeed/tag_files.hpp"
#include "formats/deepspeed/tensor_parallel_merge.hpp"
#include "formats/deepspeed/universal_input.hpp"
#include "formats/deepspeed/universal_state.hpp"

namespace ckptfs::deepspeed {

using catalog::Catalog;
using catalog::LogicalTensor;
namespace fs = std::filesystem;

namespace {

// A DeepSpeed tag's topology as its readers find it: the generic one and the ZeRO stage (DeepSpeedTag's).
struct DeepSpeedTopology : Topology {
  int zero_stage = 0;
};

// What one tag contributes before the catalogs are laid out.
struct TagParts {
  std::vector<NamedTensor> module;  // weights as the model holds them (model view order)
  std::set<std::string> buffers;
  std::vector<LogicalTensor> frozen;  // explicit frozen params (ZeRO-2/3); else derived from module
  bool frozen_from_module = true;
  std::vector<LogicalTensor> trainable;  // fp32 masters in param_shapes order
  std::vector<std::pair<std::string, std::string>> aliases;
  bool masters_known = true;  // false: no partitioned optimizer state names the masters
  // Universal checkpoint parts: per-parameter state aligned with `trainable`, the global optimizer state
  // (with the catalog of its tensors) and the model-state files ds_to_universal copies.
  std::optional<OptimizerState> optimizer;
  std::string no_universal;  // why the tag has no universal/ (when optimizer is empty)
  pickle::ValuePtr optimizer_state;
  std::shared_ptr<Catalog> optimizer_state_tensors = std::make_shared<Catalog>();
  std::vector<fs::path> model_state_copies;
  // A pipeline universal checkpoint has no layer files: the model view is the masters in this dtype.
  std::optional<DType> model_from_masters;
};

LogicalTensor with_dtype(LogicalTensor t, DType dtype) {
  t.dtype = dtype;
  return t;
}

// Position of every tensor by name (models have up to hundreds of thousands of tensors: no linear scans).
std::unordered_map<std::string, size_t> index_by_name(const std::vector<LogicalTensor>& tensors) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);
  return index;
}

const LogicalTensor* find_in(const std::vector<LogicalTensor>& tensors,
                             const std::unordered_map<std::string, size_t>& index, const std::string& name) {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

void add_aliases(std::vector<LogicalTensor>& out,
                 const std::vector<std::pair<std::string, std::string>>& aliases,
                 std::vector<std::string>& notes) {
  auto index = index_by_name(out);
  for (const auto& [alias, owner] : aliases) {
    if (index.count(alias)) continue;
    const LogicalTensor* source = find_in(out, index, owner);
    if (source == nullptr) {
      notes.push_back(fmt::format("tied parameter {} names {}, which has no data; left out", alias, owner));
      continue;
    }
    LogicalTensor copy = *source;
    copy.name = alias;
    copy.origin = fmt::format("tied to {}", owner);
    index.emplace(alias, out.size());
    out.push_back(std::move(copy));
  }
}

// `module` as logical tensors in the dtype it was saved in.
std::vector<LogicalTensor> module_tensors(const TagParts& parts) {
  std::vector<LogicalTensor> out;
  for (const auto& e : parts.module) out.push_back(whole_tensor(e.name, e.tensor, e.tensor.dtype, "module"));
  return out;
}

LogicalTensor in_fp32_view(LogicalTensor t, std::string origin) {
  t.dtype = fp32_view_dtype(t.dtype);
  t.origin = std::move(origin);
  return t;
}

// fp32 master weights in zero_to_fp32's order: buffers, frozen, trainable, tied aliases. `module` holds
// the model's weights (the module entries, or those merged over tensor-parallel ranks).
Catalog build_fp32_catalog(const TagParts& parts, const std::vector<LogicalTensor>& module,
                           std::vector<std::string>& notes) {
  Catalog c;
  std::set<std::string> trainable_names, alias_names;
  for (const auto& t : parts.trainable) trainable_names.insert(t.name);
  for (const auto& [alias, owner] : parts.aliases) alias_names.insert(alias);

  if (!parts.masters_known) {
    for (const auto& t : module) c.tensors.push_back(in_fp32_view(t, "module, upcast"));
    return c;
  }
  for (const auto& t : module)
    if (parts.buffers.count(t.name)) c.tensors.push_back(in_fp32_view(t, "buffer"));
  if (parts.frozen_from_module) {
    for (const auto& t : module)
      if (!parts.buffers.count(t.name) && !trainable_names.count(t.name) && !alias_names.count(t.name))
        c.tensors.push_back(in_fp32_view(t, "frozen, from module"));
  } else {
    for (const auto& t : parts.frozen) c.tensors.push_back(with_dtype(t, fp32_view_dtype(t.dtype)));
  }
  for (const auto& t : parts.trainable) c.tensors.push_back(t);
  add_aliases(c.tensors, parts.aliases, notes);
  return c;
}

// Weights as the model holds them: `module` entries for ZeRO-0/1/2; for ZeRO-3 (placeholders in module)
// the fp32 masters rounded to each parameter's dtype, frozen fragments and full buffers.
Catalog build_model_catalog(const TagParts& parts, bool zero3, std::vector<std::string>& notes) {
  Catalog c;
  if (parts.model_from_masters) {
    for (const auto& t : parts.trainable) c.tensors.push_back(with_dtype(t, *parts.model_from_masters));
    add_aliases(c.tensors, parts.aliases, notes);
    return c;
  }
  if (!zero3) {
    c.tensors = module_tensors(parts);
    return c;
  }
  std::map<std::string, std::string> owner_of(parts.aliases.begin(), parts.aliases.end());
  const auto trainable = index_by_name(parts.trainable), frozen = index_by_name(parts.frozen);
  for (const auto& e : parts.module) {
    if (parts.buffers.count(e.name)) {
      c.tensors.push_back(whole_tensor(e.name, e.tensor, e.tensor.dtype, "buffer"));
      continue;
    }
    const std::string& source_name = owner_of.count(e.name) ? owner_of[e.name] : e.name;
    const LogicalTensor* source = find_in(parts.trainable, trainable, source_name);
    if (source == nullptr) source = find_in(parts.frozen, frozen, source_name);
    if (source == nullptr) {
      notes.push_back(
          fmt::format("{} is a ZeRO-3 placeholder without partitions in the tag; left out", e.name));
      continue;
    }
    LogicalTensor t = with_dtype(*source, e.tensor.dtype);
    t.name = e.name;
    if (source_name != e.name) t.origin = fmt::format("tied to {}", source_name);
    c.tensors.push_back(std::move(t));
  }
  return c;
}

// The file a merged tensor's first elements come from (the tag dir for an empty tensor), for messages.
fs::path source_of(const LogicalTensor& t, const fs::path& dir) {
  const auto files = t.files();
  return files.empty() ? dir : files.front()->path();
}

// A view cannot hold two tensors of one name; the second comes from a file that repeats another's keys
// (a layer file copied over another, a dict pickled with a key twice).
void require_unique_names(const Catalog& c, const fs::path& dir, std::string_view which) {
  std::map<std::string_view, const LogicalTensor*> seen;
  for (const auto& t : c.tensors) {
    auto [it, inserted] = seen.emplace(t.name, &t);
    if (inserted) continue;
    throw FormatError(fmt::format("{}: tensor {} appears twice in the {} weights ({}; {})",
                                  source_of(t, dir).string(), t.name, which, it->second->origin, t.origin));
  }
}

DType training_dtype(const Catalog& model, const std::vector<LogicalTensor>& trainable) {
  const auto index = index_by_name(trainable);
  for (const auto& t : model.tensors)
    if (index.count(t.name) && dtype_is_floating(t.dtype)) return t.dtype;
  for (const auto& t : model.tensors)
    if (dtype_is_floating(t.dtype)) return t.dtype;
  return DType::F32;
}

std::string optimizer_name(const OptimStates& rank0) {
  if (!rank0.zero_stage) return "BF16_Optimizer";
  return *rank0.zero_stage == 3 ? "DeepSpeedZeroOptimizer_Stage3" : "DeepSpeedZeroOptimizer";
}

// The data-parallel size, ZeRO stage and optimizer of a ZeRO-1/2 or BF16_Optimizer MP rank.
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

// Adds the trainable fp32 masters and optimizer state of one MP rank (a pipeline stage) of a ZeRO-1/2 or
// BF16_Optimizer checkpoint to `parts`; a name an earlier stage added (a tied weight) is kept from there.
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

// The fp32 masters of a Mixture-of-Experts ZeRO-1/2 tag, dense and expert ones in module order.
void add_moe_stage(io::FileSet& files, const TagFiles& tf, int mp, const ModelStates& ms,
                   const std::vector<MoeLayer>& moe, DeepSpeedTopology& topo, TagParts& parts,
                   std::vector<std::string>& notes) {
  auto optim = read_optim_ranks(files, tf, mp);
  const ModelStates shaped = ms.param_shapes ? ms : with_shapes_from_slice_mappings(files, ms, optim, parts.module);
  if (!ms.param_shapes)
    notes.push_back("MoE model states without param_shapes or buffer_names (DeepSpeed <= 0.19.2): the masters are "
                    "named by the optimizer files' param_slice_mappings, and buffers are listed with the frozen "
                    "parameters");
  set_flat_topology(optim, shaped, topo);
  MoeMasters m = assemble_moe_masters(shaped, optim, moe, parts.module);
  topo.ep = m.ep_size;
  parts.trainable = std::move(m.masters);
  // DeepSpeed's universal loader looks each parameter up by the name it has on its rank, and every EP rank
  // names its experts by local id: a tree under global names would not load (docs/formats/deepspeed.md).
  parts.no_universal =
      "Mixture-of-Experts: DeepSpeed's universal loader finds expert parameters by their local expert id, "
      "the same on every expert-parallel rank (ds_to_universal refuses these checkpoints too)";
}

// Why an FP16 optimizer state kept in the model states has no universal/.
std::string model_state_optimizer_no_universal(std::string_view optimizer) {
  return fmt::format("{} state (no optimizer files; ds_to_universal cannot convert it)", optimizer);
}

TagParts read_zero3(io::FileSet& files, const TagFiles& tf, DeepSpeedTopology& topo) {
  if (tf.zero3_model_states.size() > 1)
    throw UnsupportedError(
        fmt::format("{}: tensor-parallel ZeRO-3 checkpoints (several mp ranks) are not supported yet",
                    tf.zero3_model_states.rbegin()->second.begin()->second.string()));
  const int mp = tf.zero3_model_states.begin()->first;
  auto models = read_zero3_model_ranks(files, tf, mp);
  auto optim = read_optim_ranks(files, tf, mp);
  if (optim.size() != models.size())
    throw FormatError(fmt::format("{}: the tag holds {} optimizer files but {} ZeRO-3 model-state files",
                                  models.front().path.parent_path().string(), optim.size(), models.size()));
  const ModelStates& ms = models.front();
  if (!ms.module || !ms.param_shapes)
    throw FormatError(
        fmt::format("{}: ZeRO-3 model states without 'module' or 'param_shapes'", ms.path.string()));
  if (!optim.front().zero_stage || *optim.front().zero_stage != 3)
    throw FormatError(fmt::format("{}: ZeRO-3 model-state files but this optimizer file is not ZeRO-3",
                                  optim.front().path.string()));
  topo.dp = static_cast<int>(optim.size());
  topo.zero_stage = 3;
  topo.optimizer = optimizer_name(optim.front());

  TagParts parts;
  parts.module = *ms.module;
  parts.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
  parts.trainable = assemble_zero3_groups(ms, optim);
  parts.frozen = assemble_zero3_frozen(models);
  parts.frozen_from_module = false;
  parts.aliases = ms.shared_params;
  parts.optimizer = read_optimizer_state(ms, optim, true, parts.no_universal);
  parts.optimizer_state =
      universal_optimizer_state(optim.front(), topo.dp, true, parts.optimizer_state_tensors);
  for (const auto& m : models) parts.model_state_copies.push_back(m.path);
  return parts;
}

// One MP rank of a data-parallel tag (a tensor-parallel tag reads each rank this way, then merges them).
TagParts read_data_parallel(io::FileSet& files, const TagFiles& tf, int mp, DeepSpeedTopology& topo,
                            std::vector<std::string>& notes) {
  const fs::path& path = tf.model_states.at(mp);
  ModelStates ms = read_model_states(files, path);
  if (!ms.module)
    throw FormatError(
        fmt::format("{}: 'module' is None but the tag has no pipeline layer files", path.string()));
  TagParts parts;
  parts.module = *ms.module;
  parts.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
  parts.aliases = ms.shared_params;
  std::vector<MoeLayer> moe;  // DeepSpeed saves `module` without the experts of its MoE layers
  if (!tf.expert_states.empty()) {
    moe = read_moe_layers(files, tf, ms);
    parts.module = splice_experts(parts.module, moe);
    topo.experts = expert_count(moe);
  }
  if (!tf.optim_states.count(mp)) {
    topo.zero_stage = 0;
    topo.dp = static_cast<int>(ms.dp_world_size.value_or(1));
    // MoE: mp_rank_00 holds only EP rank 0's optimizer state; every EP rank's is in its expp_rank file.
    if (!moe.empty()) {
      topo.ep = expert_parallel_size_without_zero(files, tf, ms, moe);
      if (auto m = name_moe_unfused_masters(files, tf, ms, moe, parts.module, topo.ep)) {
        parts.trainable = std::move(m->masters);
        parts.aliases = std::move(m->aliases);
        topo.optimizer = "FP16_UnfusedOptimizer (fp32 masters in the expp_rank files' optimizer['fp32_groups'])";
        parts.no_universal = model_state_optimizer_no_universal("FP16_UnfusedOptimizer");
        return parts;
      }
    }
    if (moe.empty() && (ms.unfused_fp32_groups || ms.fused_fp32_groups_flat)) {
      const bool unfused = ms.unfused_fp32_groups.has_value();
      ModelStateMasters masters = unfused ? name_unfused_masters(ms) : slice_fused_masters(ms);
      parts.trainable = std::move(masters.trainable);
      parts.aliases = std::move(masters.aliases);
      const std::string optimizer = unfused ? "FP16_UnfusedOptimizer" : "FP16_Optimizer";
      topo.optimizer = fmt::format("{} (fp32 masters in optimizer['{}'])", optimizer,
                                   unfused ? "fp32_groups" : "fp32_groups_flat");
      parts.no_universal = model_state_optimizer_no_universal(optimizer);
      return parts;
    }
    // ZeRO-0 with a torch optimizer (fp32: the module is the master) or no optimizer state: the fp32 view is
    // the module upcast.
    parts.masters_known = false;
    topo.optimizer = "none (optimizer state inside model states)";
    notes.push_back("no partitioned optimizer state: fp32/ holds the module weights upcast to fp32");
    if (!moe.empty() && ms.fused_fp32_groups_flat)
      notes.push_back("Mixture-of-Experts without ZeRO with FP16_Optimizer (fused): its fp32_groups_flat in the "
                      "expp_rank files are not read; fp32/ holds the weights upcast");
    return parts;
  }
  if (moe.empty())
    add_flat_stage(ms, read_optim_ranks(files, tf, mp), topo, parts);
  else
    add_moe_stage(files, tf, mp, ms, moe, topo, parts, notes);
  if (ms.frozen_param_fragments && ms.frozen_param_shapes) {
    parts.frozen_from_module = false;
    const NamedIndex fragments = index_named(ms.frozen_param_fragments);
    for (const auto& shape : *ms.frozen_param_shapes) {
      const NamedTensor* frag = find_named(fragments, shape.name);
      if (frag == nullptr)
        throw FormatError(
            fmt::format("{}: frozen_param_fragments has no entry for {}", path.string(), shape.name));
      parts.frozen.push_back(whole_tensor(shape.name, frag->tensor, frag->tensor.dtype, "frozen fragment"));
    }
    for (auto& t : unlisted_frozen_experts(parts.module, parts.trainable, parts.frozen))
      parts.frozen.push_back(std::move(t));
  } else if (topo.zero_stage <= 1) {
    notes.push_back("frozen parameters are taken from module (zero_to_fp32 drops them under ZeRO-1/BF16)");
  }
  return parts;
}

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

// Pipeline engines: `module` is None and weights sit in layer_XX files, one per layer (docs/formats/deepspeed.md).
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

// The universal checkpoint of the tag, and a catalog per optimizer state key in `tag`; null (with a
// note) when the tag keeps no per-parameter optimizer state.
std::shared_ptr<const UniversalPlan> universal_plan(TagParts& parts, const std::shared_ptr<Catalog>& fp32,
                                                    bool zero3, Tag& tag) {
  if (!parts.optimizer) {
    tag.notes.push_back(fmt::format("no universal/: {}", parts.no_universal.empty()
                                                             ? "no partitioned optimizer state"
                                                             : parts.no_universal));
    return nullptr;
  }
  OptimizerState& state = *parts.optimizer;
  auto plan = std::make_shared<UniversalPlan>();
  plan->bare_tensors = zero3;
  plan->state_keys = state.keys;
  plan->optimizer_state = parts.optimizer_state;
  plan->model_state_files = parts.model_state_copies;
  std::vector<std::shared_ptr<Catalog>> by_key(state.keys.size());
  for (size_t k = 0; k < state.keys.size(); ++k) {
    by_key[k] = std::make_shared<Catalog>();
    for (auto& per_param : state.tensors) by_key[k]->tensors.push_back(std::move(per_param[k]));
  }
  const auto masters = index_by_name(fp32->tensors);
  for (size_t p = 0; p < parts.trainable.size(); ++p) {
    UniversalParam param;
    param.name = parts.trainable[p].name;
    if (auto it = masters.find(param.name); it != masters.end()) param.fp32 = {fp32, it->second};
    for (const auto& c : by_key) param.state.push_back({c, p});
    param.step = state.steps[p];
    plan->params.push_back(std::move(param));
  }
  for (size_t k = 0; k < state.keys.size(); ++k) tag.states.emplace(state.keys[k], std::move(by_key[k]));
  return plan;
}

// The params a model-state copy without param_shapes names: its embedded BF16_Optimizer state's
// param_slice_mappings (pipeline ZeRO-0, DeepSpeed >= 0.18.5).
std::vector<std::string> slice_names_of(const ModelStates& ms) {
  if (ms.embedded_slice_names.empty())
    throw FormatError(
        fmt::format("{}: has no param_shapes, which a universal checkpoint needs", ms.path.string()));
  std::vector<std::string> names;
  for (const auto& group : ms.embedded_slice_names) names.insert(names.end(), group.begin(), group.end());
  return names;
}

// A universal checkpoint (<tag>_universal/): the model-state copies give module, buffers, frozen params
// and param_shapes, and zero/<param>/fp32.pt the fp32 masters in place of the optimizer files.
TagParts read_universal(io::FileSet& files, const TagFiles& tf, const fs::path& dir, DeepSpeedTopology& topo,
                        std::vector<std::string>& notes) {
  TagParts parts;
  parts.no_universal = "the source is a universal checkpoint";
  topo.optimizer = "none (universal checkpoint: fp32 masters from zero/<param>/fp32.pt)";
  if (!tf.zero3_model_states.empty()) {
    if (tf.zero3_model_states.size() > 1)
      throw UnsupportedError(fmt::format(
          "{}: tensor-parallel ZeRO-3 universal checkpoints (several mp ranks) are not supported yet",
          tf.zero3_model_states.rbegin()->second.begin()->second.string()));
    auto models = read_zero3_model_ranks(files, tf, tf.zero3_model_states.begin()->first);
    const ModelStates& ms = models.front();
    if (!ms.module || !ms.param_shapes)
      throw FormatError(
          fmt::format("{}: ZeRO-3 model states without 'module' or 'param_shapes'", ms.path.string()));
    parts.module = *ms.module;
    parts.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
    parts.trainable = read_universal_masters(files, dir, *ms.param_shapes);
    parts.frozen = assemble_zero3_frozen(models);
    parts.frozen_from_module = false;
    parts.aliases = ms.shared_params;
    topo.dp = static_cast<int>(models.size());
    topo.zero_stage = 3;
    return parts;
  }
  std::set<std::string> seen;
  bool named_by_slices = false;
  for (const auto& [mp, path] : tf.model_states) {
    ModelStates ms = read_model_states(files, path);
    named_by_slices = named_by_slices || !ms.param_shapes;
    for (auto& t : ms.param_shapes ? read_universal_masters(files, dir, *ms.param_shapes)
                                   : read_named_universal_masters(files, dir, slice_names_of(ms)))
      if (seen.insert(t.name).second) parts.trainable.push_back(std::move(t));
    parts.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
    topo.dp = static_cast<int>(ms.dp_world_size.value_or(1));
    topo.zero_stage = static_cast<int>(ms.config_zero_stage.value_or(0));
    if (mp != tf.model_states.begin()->first) continue;
    parts.aliases = ms.shared_params;
    if (ms.module) {
      parts.module = *ms.module;
    } else {
      parts.model_from_masters = ms.config_dtype;
      notes.push_back("pipeline universal checkpoint (no layer files): model.safetensors holds the fp32 "
                      "masters rounded to the training dtype; frozen parameters and buffers are not in it");
    }
  }
  topo.pp = parts.model_from_masters ? static_cast<int>(tf.model_states.size()) : 1;
  if (named_by_slices)
    for (const auto& name : universal_param_dirs(dir))
      if (!seen.contains(name))
        throw FormatError(
            fmt::format("{}: no model-state copy names this parameter (they have no param_shapes and "
                        "their param_slice_mappings cover only DP rank 0's fragments)",
                        (dir / "zero" / name).string()));
  return parts;
}

// A universal checkpoint's zero/<param>/fp32.pt files are files of the tag.
void add_master_files(Tag& tag, const TagParts& parts) {
  for (const auto& t : parts.trainable)
    for (const auto& f : t.files()) tag.files.push_back(f->path());
}

// Checks the catalogs of a tag and adds them with its universal plan.
void finish_tag(Tag& tag, TagParts& parts, std::shared_ptr<Catalog> fp32, CatalogPtr model, bool zero3) {
  const fs::path& dir = tag.dir;
  require_unique_names(*fp32, dir, "fp32");
  require_unique_names(*model, dir, "model");
  for (const catalog::Catalog* c : {static_cast<const catalog::Catalog*>(fp32.get()), model.get()}) {
    for (const auto& t : c->tensors) {
      try {
        catalog::validate(t);
      } catch (const FormatError& e) {
        throw FormatError(fmt::format("{}: {}", source_of(t, dir).string(), e.what()));
      }
    }
  }
  tag.topology.train_dtype = training_dtype(*model, parts.trainable);
  tag.deepspeed.value().universal = universal_plan(parts, fp32, zero3, tag);
  tag.add(ViewRole::fp32, std::move(fp32));
  tag.add(ViewRole::model, std::move(model));
}

// The tag as one MP rank sees it: every rank of a data-parallel or pipeline tag, or tensor-parallel rank
// `mp` of a tensor-parallel one.
RankTag read_rank(io::FileSet& files, const TagFiles& tf, const fs::path& dir, const std::string& name, int mp) {
  Tag tag;
  tag.name = name;
  tag.dir = dir;
  tag.files = tf.all();
  const bool zero3 = !tf.zero3_model_states.empty();
  const bool universal = is_universal_dir(dir);
  tag.format = universal ? "DeepSpeed universal checkpoint (ds_to_universal output)" : "DeepSpeed checkpoint";
  DeepSpeedTopology topo;
  TagParts parts = universal                  ? read_universal(files, tf, dir, topo, tag.notes)
                   : zero3                    ? read_zero3(files, tf, topo)
                   : !tf.layer_states.empty() ? read_pipeline(files, tf, topo, tag.notes)
                                              : read_data_parallel(files, tf, mp, topo, tag.notes);
  tag.topology = topo;
  tag.deepspeed = DeepSpeedTag{topo.zero_stage, nullptr};
  if (universal) add_master_files(tag, parts);
  auto model = std::make_shared<Catalog>(build_model_catalog(parts, zero3, tag.notes));
  auto fp32 = std::make_shared<Catalog>(build_fp32_catalog(parts, module_tensors(parts), tag.notes));
  finish_tag(tag, parts, fp32, model, zero3);
  return {std::move(tag), std::move(parts.buffers)};
}

// The universal checkpoint of a tensor-parallel run (ds_to_universal's output for an AutoTP tag, which
// DeepSpeed 0.19.5 saves with its universal_checkpoint_info): every TP rank's model-state copy holds its
// slices of the weights, merged here as for the tag; zero/<param>/fp32.pt holds each master merged already.
Tag read_tensor_parallel_universal(io::FileSet& files, const TagFiles& tf, const fs::path& dir,
                                   const std::string& name) {
  const UniversalInfo info = read_universal_info(files, tf.model_states.begin()->second);
  std::vector<RankTag> ranks;
  std::optional<ModelStates> first;
  for (const auto& [mp, path] : tf.model_states) {
    ModelStates ms = read_model_states(files, path);
    if (!ms.module)
      throw FormatError(
          fmt::format("{}: 'module' is None in a tensor-parallel universal checkpoint", path.string()));
    TagParts rank;
    rank.module = *ms.module;
    RankTag& r = ranks.emplace_back();
    r.tag.dir = dir;
    r.tag.add(ViewRole::model, std::make_shared<Catalog>(build_model_catalog(rank, false, r.tag.notes)));
    r.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
    if (!first) first = std::move(ms);
  }
  if (!first->param_shapes)
    throw FormatError(
        fmt::format("{}: has no param_shapes, which a universal checkpoint needs", first->path.string()));
  Tag tag = merge_tensor_parallel_ranks(std::move(ranks), info);
  tag.name = name;
  tag.format = "DeepSpeed universal checkpoint (ds_to_universal output)";
  tag.files = tf.all();
  tag.deepspeed.value().zero_stage = static_cast<int>(first->config_zero_stage.value_or(0));
  tag.topology.dp = static_cast<int>(first->dp_world_size.value_or(1));
  tag.topology.optimizer = "none (universal checkpoint: fp32 masters from zero/<param>/fp32.pt)";
  TagParts parts;
  parts.no_universal = "the source is a universal checkpoint";
  parts.buffers.insert(first->buffer_names.begin(), first->buffer_names.end());
  parts.aliases = first->shared_params;
  parts.trainable =
      read_universal_masters(files, dir, *first->param_shapes, static_cast<int>(tf.model_states.size()));
  add_master_files(tag, parts);
  CatalogPtr model = tag.catalog(ViewRole::model);  // the merge's only catalog: finish_tag adds it back with fp32
  tag.models.clear();
  auto fp32 = std::make_shared<Catalog>(build_fp32_catalog(parts, model->tensors, tag.notes));
  finish_tag(tag, parts, fp32, model, false);
  return tag;
}

// The files tensor-parallel rank `tp` of a pipeline tag reads: its stages' model-states and optimizer
// files (DeepSpeed numbers them by the rank among data rank 0's ranks: stage x TP + tp) and its layer
// files (layer_XX-model_<tp>), as a tag of its own.
TagFiles pipeline_rank_files(const TagFiles& tf, int tp, int tp_size, const fs::path& dir) {
  const int stages = tf.model_states.empty() ? 0 : tf.model_states.rbegin()->first / tp_size + 1;
  for (int mp = tp; mp < stages * tp_size; mp += tp_size)
    if (!tf.model_states.contains(mp))
      throw FormatError(fmt::format("{}: missing (a pipeline of {} stages x {} tensor-parallel ranks has one per rank)",
                                    (dir / fmt::format("mp_rank_{:02d}_model_states.pt", mp)).string(), stages, tp_size));
  TagFiles out;
  out.bf16_prefix = tf.bf16_prefix;
  for (const auto& [mp, path] : tf.model_states)
    if (mp % tp_size == tp) out.model_states.emplace(mp, path);
  for (const auto& [mp, dps] : tf.optim_states)
    if (mp % tp_size == tp) out.optim_states.emplace(mp, dps);
  for (const auto& [layer, tps] : tf.layer_states) {
    auto it = tps.find(tp);
    if (it == tps.end() || static_cast<int>(tps.size()) != tp_size)
      throw FormatError(fmt::format("{}: layer {} has files for {} tensor-parallel ranks, layer {} for {}", dir.string(),
                                    layer, tps.size(), tf.layer_states.begin()->first, tp_size));
    out.layer_states[layer][0] = it->second;
  }
  return out;
}

}  // namespace

Tag read_tag(io::FileSet& files, const fs::path& dir, const std::string& name) {
  TagFiles tf = list_tag_files(dir);
  if (tf.empty()) throw SourceError(fmt::format("{}: no DeepSpeed model-state files", dir.string()));
  require_supported_moe(tf, is_universal_dir(dir));
  // Several model-state copies in a universal dir: pipeline stages (`module` None) or TP ranks.
  if (is_universal_dir(dir) && tf.model_states.size() > 1 &&
      read_model_states(files, tf.model_states.begin()->second).module)
    return read_tensor_parallel_universal(files, tf, dir, name);
  const bool plain = tf.zero3_model_states.empty() && !is_universal_dir(dir);
  // Pipeline layers saved per tensor-parallel rank (layer_XX-model_YY: Megatron-DeepSpeed's GPTModelPipe).
  const int pipeline_tp = tf.layer_states.empty() ? 1 : static_cast<int>(tf.layer_states.begin()->second.size());
  const bool tensor_parallel =
      plain && (tf.layer_states.empty() ? tf.model_states.size() > 1 : pipeline_tp > 1);
  if (!tensor_parallel) return read_rank(files, tf, dir, name, tf.model_states.empty() ? 0 : tf.model_states.begin()->first).tag;
  // Tensor parallelism (Megatron-DeepSpeed, AutoTP): every TP rank read as a tag, then merged.
  const UniversalInfo info = read_universal_info(files, tf.model_states.begin()->second);
  std::vector<RankTag> ranks;
  if (tf.layer_states.empty()) {
    for (const auto& [mp, path] : tf.model_states) ranks.push_back(read_rank(files, tf, dir, name, mp));
  } else {
    for (int tp = 0; tp < pipeline_tp; ++tp) {
      const TagFiles rank = pipeline_rank_files(tf, tp, pipeline_tp, dir);
      ranks.push_back(read_rank(files, rank, dir, name, rank.model_states.empty() ? 0 : rank.model_states.begin()->first));
    }
  }
  Tag tag = merge_tensor_parallel_ranks(std::move(ranks), info);
  tag.files = tf.all();
  return tag;
}

}  // namespace ckptfs::deepspeed
