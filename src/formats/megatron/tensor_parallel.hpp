// How Megatron-LM splits each parameter over tensor-parallel ranks, and the merge that undoes it, as
// N-d boxes over the ranks' tensors (docs/formats/megatron.md, "Tensor-parallel merge").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/megatron/model_args.hpp"

namespace ckptfs::megatron {

enum class Split {
  Replicated,  // every rank holds the whole tensor (norms, row-parallel biases, position embeddings)
  Rows,        // column-parallel: concatenated along dim 0 (QKV, fc1, vocab-parallel embeddings)
  Columns,     // row-parallel: concatenated along dim 1 (attention output projection, fc2)
  GatedRows,   // SwiGLU fc1: each rank holds [gate_r; up_r], the whole is [all gates; all ups]
};

// The split of a parameter, from the last module name in `name` (megatron-core or legacy naming).
Split split_of(std::string_view name, const ModelArgs& args);

// One rank's copy of a parameter.
struct RankTensor {
  const torch::SourceTensor* tensor = nullptr;
  std::filesystem::path file;
};

// The merged parameter of `ranks` (one per tensor-parallel rank, in rank order), served in `dtype`.
// Throws FormatError naming the files when the ranks' shapes differ or cannot be split that way.
catalog::LogicalTensor merge_tensor_parallel(const std::string& name, Split split,
                                             const std::vector<RankTensor>& ranks, DType dtype);

}  // namespace ckptfs::megatron
