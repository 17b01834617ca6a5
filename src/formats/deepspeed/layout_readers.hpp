// The readers of a DeepSpeed tag, one per layout (tag_layout.hpp), and what several of them share. A reader
// of one rank's files returns what they contribute (TagParts) and the topology it finds; read_rank makes
// them a tag. The tensor-parallel readers read each TP rank that way, then merge the ranks.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"
#include "formats/deepspeed/state_files.hpp"
#include "formats/deepspeed/tag_files.hpp"
#include "formats/deepspeed/tag_layout.hpp"
#include "formats/deepspeed/tag_parts.hpp"
#include "formats/deepspeed/tensor_parallel_merge.hpp"

namespace ckptfs::deepspeed {

// What a tag read from a universal checkpoint says of itself, and of its (absent) universal/.
inline constexpr char kUniversalFormat[] = "DeepSpeed universal checkpoint (ds_to_universal output)";
inline constexpr char kUniversalOptimizer[] =
    "none (universal checkpoint: fp32 masters from zero/<param>/fp32.pt)";
inline constexpr char kUniversalSource[] = "the source is a universal checkpoint";

// The lowest MP rank with a model-states file (0 when there is none).
inline int first_mp_rank(const TagFiles& tf) {
  return tf.model_states.empty() ? 0 : tf.model_states.begin()->first;
}

// RankLayout::data_parallel: MP rank `mp` (a tensor-parallel tag reads each of its ranks this way).
TagParts read_data_parallel(io::FileSet& files, const TagFiles& tf, int mp, DeepSpeedTopology& topo,
                            std::vector<std::string>& notes);
// RankLayout::zero3.
TagParts read_zero3(io::FileSet& files, const TagFiles& tf, DeepSpeedTopology& topo);
// RankLayout::pipeline.
TagParts read_pipeline(io::FileSet& files, const TagFiles& tf, DeepSpeedTopology& topo,
                       std::vector<std::string>& notes);
// RankLayout::universal.
TagParts read_universal(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir,
                        DeepSpeedTopology& topo, std::vector<std::string>& notes);
// RankLayout::zero3_universal.
TagParts read_zero3_universal(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir,
                              DeepSpeedTopology& topo);

// The tag as one rank's files of `layout` make it: every rank of a data-parallel or pipeline tag, or
// tensor-parallel rank `mp` of a tensor-parallel one (`mp`: the MP rank read_data_parallel reads).
RankTag read_rank(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir,
                  const std::string& name, int mp, RankLayout layout);

// TensorParallel and PipelineTensorParallel: every TP rank read as a tag, then merged.
Tag read_tensor_parallel(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir,
                         const std::string& name);
Tag read_pipeline_tensor_parallel(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir,
                                  const std::string& name);
// TensorParallelUniversal.
Tag read_tensor_parallel_universal(io::FileSet& files, const TagFiles& tf, const std::filesystem::path& dir,
                                   const std::string& name);

// Shared by the readers of flat (ZeRO-1/2, BF16_Optimizer) optimizer files, flat_stage.cpp:
// the optimizer class that wrote DP rank 0's optimizer file;
std::string optimizer_name(const OptimStates& rank0);
// the data-parallel size, ZeRO stage and optimizer of a ZeRO-1/2 or BF16_Optimizer MP rank;
void set_flat_topology(const std::vector<OptimStates>& optim, const ModelStates& ms, DeepSpeedTopology& topo);
// adds the trainable fp32 masters and optimizer state of one MP rank (a pipeline stage) of a ZeRO-1/2 or
// BF16_Optimizer checkpoint to `parts`; a name an earlier stage added (a tied weight) is kept from there.
void add_flat_stage(const ModelStates& ms, const std::vector<OptimStates>& optim, DeepSpeedTopology& topo,
                    TagParts& parts);

// Shared by the ZeRO-3 readers, zero3_reader.cpp: what the model states of DP rank 0 (`ms`) give a ZeRO-3
// tag: `module` (placeholders and buffers), the buffer names and the tied parameters. Throws FormatError
// naming the file when `module` or `param_shapes` is missing.
TagParts zero3_module_parts(const ModelStates& ms);

}  // namespace ckptfs::deepspeed
