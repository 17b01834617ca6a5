// Data-parallel tags: one mp_rank_XX_model_states.pt holding `module`, and ZeRO-1/2 optimizer files, a
// Mixture-of-Experts layer's expert files, or (ZeRO-0) the optimizer state inside the model states.
#include <fmt/format.h>

#include <string_view>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/layout_readers.hpp"
#include "formats/deepspeed/model_state_masters.hpp"
#include "formats/deepspeed/moe_experts.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/deepspeed/rank_files.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

// The fp32 masters of a Mixture-of-Experts ZeRO-1/2 tag, dense and expert ones in module order.
void add_moe_stage(io::FileSet& files, const TagFiles& tf, int mp, const ModelStates& ms,
                   const std::vector<MoeLayer>& moe, DeepSpeedTopology& topo, TagParts& parts,
                   std::vector<std::string>& notes) {
  auto optim = read_optim_ranks(files, tf, mp);
  const ModelStates shaped =
      ms.param_shapes ? ms : with_shapes_from_slice_mappings(files, ms, optim, parts.module);
  if (!ms.param_shapes)
    notes.push_back(
        "MoE model states without param_shapes or buffer_names (DeepSpeed <= 0.19.2): the masters are "
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

}  // namespace

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
        topo.optimizer =
            "FP16_UnfusedOptimizer (fp32 masters in the expp_rank files' optimizer['fp32_groups'])";
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
      notes.push_back(
          "Mixture-of-Experts without ZeRO with FP16_Optimizer (fused): its fp32_groups_flat in the "
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

}  // namespace ckptfs::deepspeed
