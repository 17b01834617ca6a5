// Mixture-of-Experts tags (deepspeed.moe.layer.MoE with expert parallelism; docs/formats/deepspeed.md,
// Mixture of Experts): every expert under its global name, spliced into `module`, which DeepSpeed saves
// without experts, and the fp32 masters: ZeRO-1/2's, whose expert groups each expert-parallel rank
// partitions over its own expert data-parallel group, or without ZeRO those of every EP rank's expp_rank
// file.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/deepspeed/state_files.hpp"
#include "formats/deepspeed/tag_files.hpp"

namespace ckptfs::deepspeed {

// One MoE layer: its layer_{id}_expert_{E}_mp_rank_00_model_states.pt files, keys under global ids.
struct MoeLayer {
  int id = 0;
  std::string experts_prefix;                     // "<module>.deepspeed_moe.experts.deepspeed_experts."
  std::vector<std::vector<NamedTensor>> experts;  // by global expert id
};

// Refuses what is not merged (ZeRO-3, pipeline or tensor-parallel MoE, legacy expert_E files, a universal
// dir holding expert files) and expp_rank files without expert files.
void require_supported_moe(const TagFiles& tf, bool universal_dir);

// Reads and checks every expert file (layers and experts numbered 0..N-1, `num_experts` of `ms`).
std::vector<MoeLayer> read_moe_layers(io::FileSet& files, const TagFiles& tf, const ModelStates& ms);

int expert_count(const std::vector<MoeLayer>& layers);

// `module` with every layer's experts in global id order where the MoE module holds them (after its gate).
std::vector<NamedTensor> splice_experts(const std::vector<NamedTensor>& module,
                                        const std::vector<MoeLayer>& layers);

struct MoeMasters {
  std::vector<catalog::LogicalTensor> masters;  // in module order, experts under their global names
  int ep_size = 1;                              // the largest expert-parallel group
  std::vector<std::pair<std::string, std::string>> aliases;  // without ZeRO: tied entries, alias -> owner
};

// ZeRO-1/2: dense groups partitioned over all `optim` ranks, each expert group over the expert
// data-parallel group of every EP rank (E + D rank layout, or D + E with use_data_before_expert_parallel_).
MoeMasters assemble_moe_masters(const ModelStates& ms, const std::vector<OptimStates>& optim,
                                const std::vector<MoeLayer>& layers, const std::vector<NamedTensor>& module);

// DeepSpeed <= 0.19.2 saves MoE model states without param_shapes, buffer_names or ds_config: `ms` with
// param_shapes rebuilt from the optimizer files' param_slice_mappings (each group's names in flat order,
// EP rank 0's for expert groups), shaped by `module` (experts spliced in), and
// use_data_before_expert_parallel_ from the optimizer files' ds_config.
ModelStates with_shapes_from_slice_mappings(io::FileSet& files, const ModelStates& ms,
                                            const std::vector<OptimStates>& optim,
                                            const std::vector<NamedTensor>& module);

// ZeRO-2 lists frozen params as rank 0 holds them, so frozen experts of EP ranks > 0 only in their expert
// files: those expert weights that are neither a master nor in `frozen`, in module order.
std::vector<catalog::LogicalTensor> unlisted_frozen_experts(
    const std::vector<NamedTensor>& module, const std::vector<catalog::LogicalTensor>& masters,
    const std::vector<catalog::LogicalTensor>& frozen);

// Without ZeRO: the EP size the expert groups of expp_rank_0_mp_rank_00_optim_states.pt are named for (else
// the number of expp_rank files), every EP rank's file present.
int expert_parallel_size_without_zero(io::FileSet& files, const TagFiles& tf, const ModelStates& ms,
                                      const std::vector<MoeLayer>& layers);

// Without ZeRO in 16 bits (FP16_UnfusedOptimizer): the fp32 masters of every expp_rank file's fp32_groups,
// dense groups from EP rank 0's file, each EP rank's expert groups under its experts' global names, named
// by name_unfused_masters against the dense params of `ms` and that rank's experts in `module`; in module
// order. nullopt when the files hold no fp32_groups (a torch or the fused FP16_Optimizer).
std::optional<MoeMasters> name_moe_unfused_masters(io::FileSet& files, const TagFiles& tf,
                                                   const ModelStates& ms, const std::vector<MoeLayer>& layers,
                                                   const std::vector<NamedTensor>& module, int ep_size);

}  // namespace ckptfs::deepspeed
