// Assembles fp32 master weights from DeepSpeed's partitioned optimizer state (docs/formats/deepspeed.md:
// partition math): flat groups split evenly across ranks (ZeRO-1/2, BF16_Optimizer) and per-parameter
// partitions (ZeRO-3). The result describes where each element lives; no tensor data is read.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/deepspeed/state_files.hpp"

namespace ckptfs::deepspeed {

// `shapes` names the params of every group in flat-buffer order (param_shapes of `shapes_file`);
// `ranks[r]` is data-parallel rank r's optimizer file. Returns fp32 tensors in param_shapes order.
std::vector<catalog::LogicalTensor> assemble_flat_groups(const ModelStates& shapes_file,
                                                         const std::vector<OptimStates>& ranks);
std::vector<catalog::LogicalTensor> assemble_zero3_groups(const ModelStates& shapes_file,
                                                          const std::vector<OptimStates>& ranks);

// The optimizer's per-parameter state `key` (exp_avg, exp_avg_sq, ...), laid out like the fp32 masters
// (moments keep their stored dtype and the padding of every rank's partition).
std::vector<catalog::LogicalTensor> assemble_flat_state(const ModelStates& shapes_file,
                                                        const std::vector<OptimStates>& ranks,
                                                        const std::string& key);
std::vector<catalog::LogicalTensor> assemble_zero3_state(const ModelStates& shapes_file,
                                                         const std::vector<OptimStates>& ranks,
                                                         const std::string& key);

// ZeRO-3 frozen parameters: rank r's model-state file holds partition r of each one (bit16).
std::vector<catalog::LogicalTensor> assemble_zero3_frozen(const std::vector<ModelStates>& ranks);

using catalog::whole_tensor;

// Name -> tensor of a name -> tensor dict (absent dict: empty index).
using NamedIndex = std::unordered_map<std::string_view, const NamedTensor*>;
NamedIndex index_named(const std::optional<std::vector<NamedTensor>>& tensors);
const NamedTensor* find_named(const NamedIndex& index, std::string_view name);

// F16/BF16 widen to F32 in the fp32 view; every other dtype (ints, bool, F64) is kept.
DType fp32_view_dtype(DType d);

}  // namespace ckptfs::deepspeed
