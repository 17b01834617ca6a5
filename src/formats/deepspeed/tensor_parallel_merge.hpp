// Tensor-parallel DeepSpeed tags (Megatron-DeepSpeed, AutoTP: one mp_rank_XX_model_states.pt and its
// ZeRO partitions per TP rank): each rank is read as a tag of its own, then every catalog and the
// universal plan are merged by the patterns the checkpoint's universal_checkpoint_info declares, as
// ds_to_universal merges them (docs/formats/deepspeed.md, "Tensor parallelism").
#pragma once

#include <filesystem>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io.hpp"
#include "formats/tensor_parallel.hpp"

namespace ckptfs::deepspeed {

// One TP rank read as a tag, with the names of its buffers (which are never split).
struct RankTag {
  Tag tag;
  std::set<std::string> buffers;
};

// The pattern lists of universal_checkpoint_info (Python re.match: anchored at the start only).
class UniversalInfo {
 public:
  struct Patterns {
    std::vector<std::string> text;
    std::vector<std::regex> compiled;
    bool matches(const std::string& name) const;
  };
  Patterns replicated, average, row_parallel, two_sub_params, sub_params, vocabulary;
  std::optional<int64_t> original_vocab_size;
  std::filesystem::path file;  // the model-state file it was read from

  // The split of parameter `name`; throws UnsupportedError for averaged and fused sub-parameters.
  formats::Split split_of(const std::string& name) const;
};

// Reads universal_checkpoint_info from a model-state file. Throws UnsupportedError naming the file when it
// has none (then nothing says how each parameter was split), FormatError when a pattern is malformed.
UniversalInfo read_universal_info(io::FileSet& files, const std::filesystem::path& model_states);

// The merged tag: catalogs merged name by name over the ranks (in rank order), the universal plan's
// files as ds_to_universal writes them for a TP checkpoint (cat_dim, param_n_sub_params, vocab_tensor,
// vocabulary rows trimmed to original_vocab_size).
Tag merge_tensor_parallel_ranks(std::vector<RankTag> ranks, const UniversalInfo& info);

}  // namespace ckptfs::deepspeed
