// Universal checkpoints (<tag>_universal/, docs/formats/universal.md): the model-state copies give module,
// buffers, frozen params and param_shapes, and zero/<param>/fp32.pt the fp32 masters in place of the
// optimizer files.
#include <fmt/format.h>

#include <set>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/deepspeed/rank_files.hpp"
#include "formats/deepspeed/universal_input.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

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

}  // namespace

// Of a data-parallel or pipeline tag.
TagParts read_universal(io::FileSet& files, const TagFiles& tf, const fs::path& dir, DeepSpeedTopology& topo,
                        std::vector<std::string>& notes) {
  TagParts parts;
  parts.no_universal = kUniversalSource;
  topo.optimizer = kUniversalOptimizer;
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
      notes.push_back(
          "pipeline universal checkpoint (no layer files): model.safetensors holds the fp32 "
          "masters rounded to the training dtype; frozen parameters and buffers are not in it");
    }
  }
  topo.pp = parts.model_from_masters ? static_cast<int>(tf.model_states.size()) : 1;
  if (named_by_slices)
    for (const auto& name : universal_param_dirs(files.source(), dir))
      if (!seen.contains(name))
        throw FormatError(
            fmt::format("{}: no model-state copy names this parameter (they have no param_shapes and "
                        "their param_slice_mappings cover only DP rank 0's fragments)",
                        (dir / "zero" / name).string()));
  return parts;
}

// Of a ZeRO-3 tag: its model-state copies are one per DP rank.
TagParts read_zero3_universal(io::FileSet& files, const TagFiles& tf, const fs::path& dir,
                              DeepSpeedTopology& topo) {
  auto models = read_zero3_model_ranks(files, tf, tf.zero3_model_states.begin()->first);
  const ModelStates& ms = models.front();
  TagParts parts = zero3_module_parts(ms);
  parts.no_universal = kUniversalSource;
  topo.optimizer = kUniversalOptimizer;
  parts.trainable = read_universal_masters(files, dir, *ms.param_shapes);
  parts.frozen = assemble_zero3_frozen(models);
  parts.frozen_from_module = false;
  topo.dp = static_cast<int>(models.size());
  topo.zero_stage = 3;
  return parts;
}

}  // namespace ckptfs::deepspeed
