// The checkpoint files of one DeepSpeed tag directory, classified by name (docs/formats/deepspeed.md: files).
#pragma once

#include <filesystem>
#include <map>
#include <vector>

#include "ckptfs/io_tree.hpp"

namespace ckptfs::deepspeed {

struct TagFiles {
  std::map<int, std::filesystem::path> model_states;  // mp_rank_XX_model_states.pt by MP rank
  std::map<int, std::map<int, std::filesystem::path>> zero3_model_states;  // [mp][dp]
  std::map<int, std::map<int, std::filesystem::path>> optim_states;        // [mp][dp]
  std::map<int, std::map<int, std::filesystem::path>> layer_states;        // [layer][tp]
  // Mixture-of-Experts (moe_experts.hpp): layer_{L}_expert_{E}_mp_rank_XX files by [moe layer][global expert]
  // for mp rank 0, and without ZeRO the expp_rank_{ep}_mp_rank_XX optimizer files by EP rank.
  std::map<int, std::map<int, std::filesystem::path>> expert_states;
  std::map<int, std::filesystem::path> expert_optim_states;
  std::vector<std::filesystem::path> unsupported_expert_files;  // legacy expert_E_* or mp rank > 0
  bool bf16_prefix = false;                                     // optimizer files are bf16_zero_pp_rank_*

  bool empty() const { return model_states.empty() && zero3_model_states.empty(); }
  std::vector<std::filesystem::path> all() const;
};

// Lists `dir` and classifies every DeepSpeed file in it; other files are ignored.
TagFiles list_tag_files(const io::Source& source, const std::filesystem::path& dir);

// True when `dir` holds DeepSpeed model-state files.
bool is_tag_dir(const io::Source& source, const std::filesystem::path& dir);

}  // namespace ckptfs::deepspeed
