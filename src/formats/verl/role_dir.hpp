// One role dir of a verl FSDP checkpoint (global_step_N/actor/, global_step_N/critic/): what
// FSDPCheckpointManager.save_checkpoint wrote there, every rank's model shards merged into one catalog.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/io_tree.hpp"

namespace ckptfs::formats::verl {

struct RoleDir {
  std::string name;  // "actor", "critic"
  std::filesystem::path dir;
  int world_size = 0;
  std::optional<int> fsdp_version;  // fsdp_config.json's FSDP_version (absent in older verl saves)
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  // The merged parameters in their saved dtype, in rank 0's state-dict order.
  std::shared_ptr<catalog::Catalog> parameters;
  std::string optimizer;                        // what optim_world_size_*.pt hold, for inspect
  std::vector<std::filesystem::path> files;     // every checkpoint file read or checked
  std::vector<std::filesystem::path> hf_files;  // huggingface/'s config, generation config, tokenizer
  std::vector<std::string> notes;
};

// True when `dir` holds model_world_size_W_rank_R.pt files and what verl writes beside them (optim_ or
// extra_state_ rank files, fsdp_config.json, huggingface/), or sits in a global_step_N dir.
bool is_role_dir(const io::Source& source, const std::filesystem::path& dir);

// Reads and merges a role dir. Throws FormatError naming the file when a rank file is missing, the world
// size disagrees with fsdp_config.json, ranks disagree on names, placements or shapes, or the shards do
// not tile a parameter; UnsupportedError for placements other than Shard and Replicate.
RoleDir read_role_dir(io::FileSet& files, const std::filesystem::path& dir);

}  // namespace ckptfs::formats::verl
