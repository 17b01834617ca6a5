// The one tensor-parallel merge of the adapters: each adapter names the rule of every parameter
// (Megatron-LM by module name, DeepSpeed by its universal_checkpoint_info patterns) and this merge undoes
// it, as N-d boxes over the ranks' tensors (docs/formats/megatron.md, "Tensor-parallel merge").
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/catalog.hpp"

namespace ckptfs::formats {

enum class Split {
  Replicated,  // every rank holds the whole tensor (norms, row-parallel biases, position embeddings)
  Rows,        // column-parallel: concatenated along dim 0 (QKV, fc1, vocab-parallel embeddings)
  Columns,     // row-parallel: concatenated along dim 1 (attention output projection, fc2)
  GatedRows,   // SwiGLU fc1: each rank holds [gate_r; up_r], the whole is [all gates; all ups]
};

// A parameter fused from sub-parameters along `dim`, each split over the TP ranks: rank r holds
// widths[s][r] of sub-parameter s, its pieces one after another (AutoTP's fused QKV; Split::Rows is one
// sub-parameter along dim 0, Split::Columns one along dim 1, Split::GatedRows two equal ones along dim 0).
struct SubParams {
  size_t dim = 0;
  std::vector<int64_t> sizes;                // per sub-parameter
  std::vector<std::vector<int64_t>> widths;  // [sub-parameter][TP rank]
};

// How one parameter is merged over the TP ranks: a split, or a fused parameter's sub-parameters.
using TensorParallelRule = std::variant<Split, SubParams>;

// One rank's copy of a parameter: a tensor of a rank file, or a logical tensor (a TP slice that is
// itself assembled from data-parallel partitions).
struct RankTensor {
  torch::SourceTensor tensor;  // for `inner`: catalog::element_view(*inner)
  std::shared_ptr<const catalog::LogicalTensor> inner;
  std::filesystem::path file;  // named in errors
};

RankTensor rank_tensor(const torch::SourceTensor& tensor, std::filesystem::path file);
RankTensor rank_tensor(std::shared_ptr<const catalog::LogicalTensor> tensor, std::filesystem::path file);

// The merged parameter of `ranks` (one per tensor-parallel rank, in rank order) under `rule`, served in
// `dtype`. A replicated parameter serves TP rank 0's copy; with `notes`, copies that differ (compared when
// at most 1 MiB: norms and biases) add a note naming `what` (the parameter, with its catalog where that
// helps). Throws FormatError naming the files when
// the ranks' shapes differ or cannot be split that way.
catalog::LogicalTensor merge_tensor_parallel(const std::string& name, const TensorParallelRule& rule,
                                             const std::vector<RankTensor>& ranks, DType dtype,
                                             std::vector<std::string>* notes, const std::string& what);

}  // namespace ckptfs::formats
