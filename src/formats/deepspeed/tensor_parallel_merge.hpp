// Tensor-parallel DeepSpeed tags (Megatron-DeepSpeed, AutoTP: one mp_rank_XX_model_states.pt and its
// ZeRO partitions per TP rank): each rank is read as a tag of its own, then every catalog and the
// universal plan are merged by the patterns the checkpoint's universal_checkpoint_info declares, as
// ds_to_universal merges them (docs/formats/deepspeed.md, "Tensor parallelism").
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"
#include "formats/deepspeed/name_pattern.hpp"
#include "formats/tensor_parallel.hpp"

namespace ckptfs::deepspeed {

// One TP rank read as a tag, with the names of its buffers (which are never split).
struct RankTag {
  Tag tag;
  std::set<std::string> buffers;
};

// universal_checkpoint_info: its pattern lists (Python re.match: anchored at the start only) and the
// facts ds_to_universal merges by.
class UniversalInfo {
 public:
  struct Patterns {
    std::vector<NamePattern> list;
    // The first pattern that matches `name`; nullptr when none.
    const NamePattern* first_match(const std::string& name) const;
    bool matches(const std::string& name) const { return first_match(name) != nullptr; }
  };
  // A parameter_with_sub_params entry: a fused parameter (an AutoTP qkv_proj) whose sub-parameters are
  // each split over the TP ranks along `partition_dim`; each rank holds its share of every sub-parameter,
  // one after another.
  struct SubParams {
    Patterns patterns;
    std::shared_ptr<const pickle::Value> entry;  // the saved dict {patterns, shape, partition_dim}
    int64_t partition_dim = 0;
  };
  Patterns replicated, average, row_parallel, two_sub_params, vocabulary;
  std::vector<SubParams> sub_params;
  // sub_param_shard_widths (version 0.4): per pattern, per sub-parameter, each TP rank's width.
  std::map<std::string, std::vector<std::vector<int64_t>>> shard_widths;
  double version = 0;
  std::optional<int64_t> original_vocab_size;
  std::filesystem::path file;  // the model-state file it was read from

  // The split of parameter `name` (fused sub-parameters are sub_params_of's); throws UnsupportedError for
  // averaged parameters.
  formats::Split split_of(const std::string& name) const;
  // The sub-parameter entry `name` matches and the pattern that matched; nullptr when none.
  const SubParams* sub_params_of(const std::string& name, std::string* pattern) const;
};

// Reads universal_checkpoint_info from a model-state file. Throws UnsupportedError naming the file when it
// has none (then nothing says how each parameter was split), FormatError when a pattern is malformed or
// outside the syntax NamePattern supports.
UniversalInfo read_universal_info(io::FileSet& files, const std::filesystem::path& model_states);
// The same from the unpickled state dict `root` of `model_states`.
UniversalInfo read_universal_info(const pickle::ValuePtr& root, const std::filesystem::path& model_states);

// The merged tag: catalogs merged name by name over the ranks (in rank order), the universal plan's
// files as ds_to_universal writes them for a TP checkpoint (cat_dim, param_n_sub_params, vocab_tensor,
// vocabulary rows trimmed to original_vocab_size).
Tag merge_tensor_parallel_ranks(std::vector<RankTag> ranks, const UniversalInfo& info);

}  // namespace ckptfs::deepspeed
