// The fp32 masters of a torch_dist checkpoint whose distributed optimizer saved its state per
// model-parallel domain (dp_group_idx = pp x TP + tp), not in the model's geometry
// (docs/formats/megatron.md, "fp32 master weights"):
// - dp_reshardable (megatron-core's default since 0.15): per model chunk (gbuf_idx) and gradient bucket one
//   1-D tensor `optimizer.distributed.dp_group_idx_{i}.gbuf_idx_{g}.dtype_{(param,
//   grad)}.bucket_idx_{b}.param`, with the sizes recorded in the ShardedObject
//   `...dp_group_idx_{i}.per_bucket_numel_unpadded`;
// - dp_zero_gather_scatter (core 0.7-0.14): the ShardedObject `...dp_group_idx_{i}.param_state`, the same
//   coalesced dict distrib_optim.pt holds.
// Either way the parameters sit where the buffer layout puts them, and nothing in the checkpoint names
// them: they are the merged model's, split back into each domain's local shapes in Megatron's parameter
// order, and the layers of each chunk are the count whose layout gives exactly the saved sizes.
#pragma once

#include <memory>

#include "ckptfs/catalog.hpp"
#include "formats/dcp/dcp_items.hpp"
#include "formats/megatron/model_args.hpp"

namespace ckptfs::megatron {

// Whether `md` holds the distributed optimizer's per-domain items.
bool has_bucketed_masters(const dcp::Metadata& md);

// The masters merged like `model` (the merged weights, Megatron's TP=1 names in state-dict order), served
// in float32. Throws FormatError naming the metadata file when the saved buffers fit no layer split or
// contradict each other, UnsupportedError for MoE's chained optimizers.
std::shared_ptr<catalog::Catalog> masters_from_buckets(const dcp::Metadata& md, const dcp::ItemReader& reader,
                                                       const catalog::Catalog& model, const ModelArgs& args);

}  // namespace ckptfs::megatron
