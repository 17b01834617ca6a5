// What ckptfs needs from DeepSpeed's model-state and optimizer-state files (docs/formats/deepspeed.md: model
// and optimizer states), extracted from their pickles without reading tensor data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/torch.hpp"

namespace ckptfs::deepspeed {

struct NamedTensor {
  std::string name;
  torch::SourceTensor tensor;
};

struct NamedShape {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
};

struct ModelStates {
  std::filesystem::path path;
  std::optional<std::vector<NamedTensor>> module;  // nullopt for pipeline engines (`module` is None)
  std::vector<std::string> buffer_names;
  std::optional<std::vector<std::vector<NamedShape>>> param_shapes;  // one list per flat group / sub-group
  std::optional<std::vector<NamedShape>> frozen_param_shapes;
  std::optional<std::vector<NamedTensor>> frozen_param_fragments;
  std::vector<std::pair<std::string, std::string>> shared_params;  // alias -> owner
  std::optional<int64_t> config_zero_stage;                        // ds_config.zero_optimization.stage
  DType config_dtype = DType::F32;  // ds_config: BF16 / F16 when bf16 / fp16 is enabled
  std::optional<int64_t> dp_world_size;
  std::string ds_version;
  // ZeRO-0 FP16_UnfusedOptimizer: optimizer['fp32_groups'], the unnamed fp32 masters per param group;
  // FP16_Optimizer (fused): optimizer['fp32_groups_flat'], each group's masters flattened.
  std::optional<std::vector<std::vector<torch::SourceTensor>>> unfused_fp32_groups;
  std::optional<std::vector<torch::SourceTensor>> fused_fp32_groups_flat;
  // A BF16_Optimizer state inside the file (pipeline ZeRO-0, DeepSpeed >= 0.18.5): its param_slice_mappings
  // names per group (this DP rank's fragments), in flat order.
  std::vector<std::vector<std::string>> embedded_slice_names;
  // MoE: experts per MoE layer (`num_experts`) and ds_config's use_data_before_expert_parallel_ (D + E
  // rank layout instead of E + D).
  std::vector<int64_t> num_experts;
  bool data_before_expert_parallel = false;
};

struct OptimStates {
  std::filesystem::path path;
  std::optional<int64_t> zero_stage;             // absent in BF16_Optimizer files
  std::vector<int64_t> partition_count;          // per group (ZeRO-3: a single value)
  std::vector<torch::SourceTensor> fp32_groups;  // single_partition_of_fp32_groups / fp32_flat_groups
  // The wrapped torch optimizer's state per group (ZeRO-3: per sub-group) index: its tensors by key, in
  // order (Adam: step, exp_avg, exp_avg_sq), each moment a flat partition laid out like fp32_groups.
  std::map<int64_t, std::vector<NamedTensor>> group_state;
  pickle::ValuePtr inner;  // optimizer_state_dict as unpickled (universal/ rebuilds optimizer_state.pt)
  // param_slice_mappings (ZeRO-1/2, BF16_Optimizer): per group, the names of the params this rank holds a
  // fragment of, in flat-buffer order.
  std::vector<std::vector<std::string>> slice_names;
  std::vector<bool> expert_groups;  // ZeRO-1/2: per group, `moe` of its param group (partitioned over EDP)
};

// MoE without ZeRO: one expert-parallel rank's expp_rank_<e>_mp_rank_00_optim_states.pt, {'optimizer': that
// rank's optimizer.state_dict()}.
struct ExpertRankOptimizer {
  std::filesystem::path path;
  std::vector<std::string> group_names;  // each torch param group's 'name' ("" when it has none)
  std::vector<bool> expert_groups;       // each torch param group's 'moe'
  std::optional<std::vector<std::vector<torch::SourceTensor>>> unfused_fp32_groups;  // FP16_UnfusedOptimizer
  bool fused = false;  // FP16_Optimizer: fp32_groups_flat
};

ModelStates read_model_states(io::FileSet& files, const std::filesystem::path& path);
OptimStates read_optim_states(io::FileSet& files, const std::filesystem::path& path);
ExpertRankOptimizer read_expert_rank_optimizer(io::FileSet& files, const std::filesystem::path& path);

// A plain torch.save'd state dict (pipeline layer files): name -> tensor in file order.
std::vector<NamedTensor> read_state_dict(io::FileSet& files, const std::filesystem::path& path);

}  // namespace ckptfs::deepspeed
