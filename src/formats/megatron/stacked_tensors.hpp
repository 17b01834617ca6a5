// Taking torch_dist's stacked tensors apart: an entry of a stacked dimension (a layer, an expert), and the
// distributed optimizer's fully_sharded_model_space masters put back into the model's shape.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::megatron {

// Entry `index` of a stacked tensor (a layer, an expert): its boxes cut at that index of dimension 0,
// which is then dropped.
catalog::LogicalTensor stacked_entry(const catalog::LogicalTensor& stacked, int64_t index, std::string name);

// fully_sharded_model_space (core 0.8-0.14 with fully parallel saving, the default there) saves the master of
// a model tensor of shape S, split into fragments F[d] along each dimension (local shards of S[d] / F[d]), as
// a tensor [F..., numel of a local shard]: per fragment its local shard flattened, each DP rank saving its
// range of it (dist_checkpointing/strategies/torch.py sharded_tensor_to_torch_sharded_tensor, "N-D flattened"
// ShardedTensors; 1-D tensors keep their shape). `stored` back in `model_shape` (views of its chunks), or
// nullopt when it is no such tensor (not one dimension more, or sizes that do not divide).
std::optional<catalog::LogicalTensor> unflatten_fragments(const catalog::LogicalTensor& stored,
                                                          const std::vector<int64_t>& model_shape);

}  // namespace ckptfs::megatron
