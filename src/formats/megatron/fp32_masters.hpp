// The fp32 master weights of one Megatron-LM rank file (docs/formats/megatron.md, "fp32 masters"): from
// the non-distributed optimizer's fp32_from_fp16_params, or from distrib_optim.pt, whose flat buffers
// hold every parameter of a model chunk at offsets the buffer layout defines.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/torch.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::megatron {

// A trainable parameter of a rank file, in named_parameters() order (chunk by chunk).
struct ParamSlot {
  size_t chunk = 0;  // virtual-pipeline chunk (model0, model1, ...)
  std::string name;  // as the rank file names it
  std::vector<int64_t> shape;
  bool shared_embedding = false;  // tied embedding with PP > 1: DDP gives it a bucket of its own
  bool expert = false;            // a routed expert's parameter: the expert optimizer's, under MoE
};

// Where a distributed optimizer's buffer keeps `params` (one model chunk's, in named_parameters order):
// filled in reverse order, starts aligned to `alignment` elements (64 since core 0.8, else 1), a shared
// embedding in a bucket of its own and, with overlap_grad_reduce, a bucket closed after the parameter that
// brings it to `bucket_size` elements. Offsets count in the saved buffer, whose buckets lie end to end
// without their end padding.
struct BufferLayout {
  std::vector<int64_t> offsets;       // per parameter
  std::vector<int64_t> bucket_sizes;  // per bucket, without its end padding (per_bucket_numel_unpadded)
  int64_t total = 0;                  // the sum of bucket_sizes (numel_unpadded)
};
BufferLayout buffer_layout(const std::vector<const ParamSlot*>& params, int64_t alignment,
                           std::optional<int64_t> bucket_size);

// Elements [offset, offset + numel(shape)) of the flat contiguous tensor `flat`, shaped `shape`.
torch::SourceTensor flat_view(const torch::SourceTensor& flat, int64_t offset,
                              const std::vector<int64_t>& shape);

// Buffer `c`'s one entry (keyed by the grad dtype, or a dtype pair: {'param', 'exp_avg', ...}) in a
// distributed optimizer's dict of buffers (distrib_optim.pt and its torch_dist counterparts). Throws
// FormatError naming the file when it is missing or has several dtypes.
formats::Field buffer_of(const formats::Field& root, size_t c);

// Masters from a rank file's `optimizer` entry (the non-distributed mixed-precision optimizer), aligned
// with `params`: its fp32_from_fp16_params hold one list per param group, the parameters in order split
// into weight-decay and no-decay groups (1-D tensors and biases), which group comes first recognised
// from the saved shapes. Under MoE the entry is a list (ChainedOptimizer): the dense parameters' optimizer,
// then the experts'. Throws FormatError naming the file when no grouping matches.
std::vector<torch::SourceTensor> masters_from_optimizer(const formats::Field& optimizer,
                                                        const std::vector<ParamSlot>& params);

// Masters from a distrib_optim.pt archive, aligned with `params`: the coalesced layout megatron-core
// writes since 0.7 (per buffer one flat fp32 tensor of numel_unpadded elements), the bucket lists of
// core 0.4-0.6 (a tensor per bucket) and the single padded buffer of 2023 (`dp`: the data-parallel size it is
// padded for; `bucket_size`: DDP's bucket size when gradient reduction was overlapped, else nullopt). Under
// MoE the file is a list [dense, experts]; in the file of an EP rank > 0 (`ep_rank`) the dense entry is None
// and its masters stay empty (the merged model takes dense weights from EP rank 0). Throws FormatError naming
// the file when the sizes do not add up under any known layout or a chunk has several buffers (grad dtypes).
std::vector<torch::SourceTensor> masters_from_distrib_optim(const torch::TorchArchive& archive,
                                                            const std::vector<ParamSlot>& params, int dp,
                                                            std::optional<int64_t> bucket_size, int ep_rank);

}  // namespace ckptfs::megatron
