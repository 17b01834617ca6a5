// Tensor-parallel merges shared by the adapters (Megatron-LM by module name, DeepSpeed by its
// universal_checkpoint_info patterns): how a parameter is split over TP ranks and the merge that undoes
// it, as N-d boxes over the ranks' tensors (docs/formats/megatron.md, "Tensor-parallel merge").
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::formats {

enum class Split {
  Replicated,  // every rank holds the whole tensor (norms, row-parallel biases, position embeddings)
  Rows,        // column-parallel: concatenated along dim 0 (QKV, fc1, vocab-parallel embeddings)
  Columns,     // row-parallel: concatenated along dim 1 (attention output projection, fc2)
  GatedRows,   // SwiGLU fc1: each rank holds [gate_r; up_r], the whole is [all gates; all ups]
};

// One rank's copy of a parameter: a tensor of a rank file, or a logical tensor (a TP slice that is
// itself assembled from data-parallel partitions).
struct RankTensor {
  torch::SourceTensor tensor;  // for `inner`: catalog::element_view(*inner)
  std::shared_ptr<const catalog::LogicalTensor> inner;
  std::filesystem::path file;  // named in errors
};

RankTensor rank_tensor(const torch::SourceTensor& tensor, std::filesystem::path file);
RankTensor rank_tensor(std::shared_ptr<const catalog::LogicalTensor> tensor, std::filesystem::path file);

// The first rank whose copy of a replicated parameter differs from rank 0's, comparing the bytes only
// when the tensor is at most `max_bytes` (norms and biases; a weight matrix is never compared).
std::optional<size_t> differing_replica(const std::string& name, const std::vector<RankTensor>& ranks,
                                        uint64_t max_bytes = uint64_t{1} << 20);

// The merged parameter of `ranks` (one per tensor-parallel rank, in rank order), served in `dtype`.
// Throws FormatError naming the files when the ranks' shapes differ or cannot be split that way.
catalog::LogicalTensor merge_tensor_parallel(const std::string& name, Split split,
                                             const std::vector<RankTensor>& ranks, DType dtype);

}  // namespace ckptfs::formats
