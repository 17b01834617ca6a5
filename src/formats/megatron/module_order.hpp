// The order of megatron-core GPTModel parameters in the model's named_parameters() (and state dict), from
// their merged TP=1 names: the module registration order of LanguageModelEmbedding, TransformerBlock /
// TransformerLayer, SelfAttention, MLP, MoELayer and TransformerEngine's fused linears.
// torch_dist's .metadata lists keys in the order the ranks' save plans reach them (rank 0's first); with
// DP > 1 the fully parallel save spreads a domain's tensors over its replicas, so that order is not the
// model's, and the distributed optimizer's buffers (packed in reverse named_parameters order) need the
// model's.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::megatron {

// A sort key of `name`'s place in the model's parameter order, or nullopt for a module this table does not
// know.
std::optional<std::vector<int64_t>> module_order_key(std::string_view name);

// Whether every tensor's place is known.
bool module_order_known(const std::vector<catalog::LogicalTensor>& tensors);

// Sorts `tensors` into the model's parameter order when every place is known (else leaves them as they are).
void sort_into_module_order(std::vector<catalog::LogicalTensor>& tensors);

}  // namespace ckptfs::megatron
