// The fp32 masters of a torch_dist checkpoint saved by the distributed optimizer in its dp_reshardable
// layout (megatron-core's default since 0.15): per model-parallel domain (dp_group_idx = pp x TP + tp),
// model chunk (gbuf_idx) and gradient bucket one 1-D tensor
// `optimizer.distributed.dp_group_idx_{i}.gbuf_idx_{g}.dtype_{(param, grad)}.bucket_idx_{b}.param` holding
// the bucket's parameters where the buffer layout puts them (docs/formats/megatron.md, "torch_dist").
// Nothing in the checkpoint names those parameters: they are the merged model's, split back into each
// domain's local shapes in Megatron's parameter order, and the layers of each chunk are the count whose
// layout gives exactly the saved per_bucket_numel_unpadded.
#pragma once

#include <memory>

#include "ckptfs/catalog.hpp"
#include "formats/dcp/dcp_items.hpp"
#include "formats/megatron/model_args.hpp"

namespace ckptfs::megatron {

// Whether `md` holds the distributed optimizer's per-domain items (dp_reshardable or
// dp_zero_gather_scatter).
bool has_bucketed_masters(const dcp::Metadata& md);

// The masters merged like `model` (the merged weights, Megatron's TP=1 names in state-dict order), served
// in float32. Throws FormatError naming the metadata file when the saved buckets fit no layer split,
// UnsupportedError for what is not mapped (dp_zero_gather_scatter, MoE's chained optimizers, several
// buffers per chunk).
std::shared_ptr<catalog::Catalog> masters_from_buckets(const dcp::Metadata& md, const dcp::ItemReader& reader,
                                                      const catalog::Catalog& model, const ModelArgs& args);

}  // namespace ckptfs::megatron
