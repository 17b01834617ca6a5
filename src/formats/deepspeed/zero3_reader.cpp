// ZeRO-3 tags: zero_pp_rank_R_mp_rank_00_model_states.pt and the optimizer file of every DP rank, the
// masters assembled from each rank's partition of every parameter (docs/formats/deepspeed.md).
#include <fmt/format.h>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/deepspeed/rank_files.hpp"
#include "formats/deepspeed/universal_state.hpp"

namespace ckptfs::deepspeed {

TagParts zero3_module_parts(const ModelStates& ms) {
  if (!ms.module || !ms.param_shapes)
    throw FormatError(
        fmt::format("{}: ZeRO-3 model states without 'module' or 'param_shapes'", ms.path.string()));
  TagParts parts;
  parts.module = *ms.module;
  parts.buffers.insert(ms.buffer_names.begin(), ms.buffer_names.end());
  parts.aliases = ms.shared_params;
  return parts;
}

// (tag_layout refuses ZeRO-3 model states of several MP ranks.)
TagParts read_zero3(io::FileSet& files, const TagFiles& tf, DeepSpeedTopology& topo) {
  const int mp = tf.zero3_model_states.begin()->first;
  auto models = read_zero3_model_ranks(files, tf, mp);
  auto optim = read_optim_ranks(files, tf, mp);
  if (optim.size() != models.size())
    throw FormatError(fmt::format("{}: the tag holds {} optimizer files but {} ZeRO-3 model-state files",
                                  models.front().path.parent_path().string(), optim.size(), models.size()));
  const ModelStates& ms = models.front();
  TagParts parts = zero3_module_parts(ms);
  if (!optim.front().zero_stage || *optim.front().zero_stage != 3)
    throw FormatError(fmt::format("{}: ZeRO-3 model-state files but this optimizer file is not ZeRO-3",
                                  optim.front().path.string()));
  topo.dp = static_cast<int>(optim.size());
  topo.zero_stage = 3;
  topo.optimizer = optimizer_name(optim.front());

  parts.trainable = assemble_zero3_groups(ms, optim);
  parts.frozen = assemble_zero3_frozen(models);
  parts.frozen_from_module = false;
  parts.optimizer = read_optimizer_state(ms, optim, true, parts.no_universal);
  parts.optimizer_state =
      universal_optimizer_state(optim.front(), topo.dp, true, parts.optimizer_state_tensors);
  for (const auto& m : models) parts.model_state_copies.push_back(m.path);
  return parts;
}

}  // namespace ckptfs::deepspeed
