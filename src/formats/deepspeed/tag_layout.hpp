// How a DeepSpeed tag dir is laid out (docs/formats/deepspeed.md, Files), decided in one place from its
// files: which reader of layout_readers.hpp reads it.
#pragma once

#include <filesystem>
#include <variant>

#include "ckptfs/io.hpp"
#include "formats/deepspeed/tag_files.hpp"

namespace ckptfs::deepspeed {

// The files of one rank's tag (a tensor-parallel tag reads each of its TP ranks as one of these).
enum class RankLayout {
  data_parallel,    // mp_rank_XX_model_states.pt holding `module`: ZeRO-0/1/2, FP16/BF16 optimizers, MoE
  zero3,            // zero_pp_rank_R_mp_rank_00_model_states.pt, one per DP rank
  pipeline,         // `module` None, the weights in layer_XX-model_00 files, a model-states file per stage
  universal,        // ds_to_universal's output for a data-parallel or pipeline tag
  zero3_universal,  // ds_to_universal's output for a ZeRO-3 tag
};

// mp_rank_XX_model_states.pt for several XX (Megatron-DeepSpeed, AutoTP): each a data-parallel rank, merged.
struct TensorParallel {
  bool operator==(const TensorParallel&) const = default;
};
// layer_XX-model_YY for several YY (Megatron-DeepSpeed's GPTModelPipe): each TP rank a pipeline, merged.
struct PipelineTensorParallel {
  bool operator==(const PipelineTensorParallel&) const = default;
};
// ds_to_universal's output for a TensorParallel tag: several model-state copies, each holding `module`.
struct TensorParallelUniversal {
  bool operator==(const TensorParallelUniversal&) const = default;
};

using TagLayout = std::variant<RankLayout, TensorParallel, PipelineTensorParallel, TensorParallelUniversal>;

// The layout of the tag in `dir` whose files are `tf` (not empty). Throws UnsupportedError naming a file for
// tensor-parallel ZeRO-3 (ZeRO-3 model states of several mp ranks), which no reader reads.
TagLayout tag_layout(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir);

}  // namespace ckptfs::deepspeed
