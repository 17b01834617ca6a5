// Per-rank torch.save files of a model's state dict (verl's model_world_size_W_rank_R.pt, FSDP's per-rank
// saves): each value a DTensor shard (FSDP2, FSDP1 with a device mesh), a ShardedTensor (FSDP1's
// LOCAL_STATE_DICT flat parameters) or a plain tensor; and the merge of DTensor state dicts over the ranks.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "ckptfs/io.hpp"
#include "formats/dtensor.hpp"
#include "formats/sharded_tensor.hpp"

namespace ckptfs::formats {

using RankValue = std::variant<torch::SourceTensor, DTensorShard, ShardedTensorValue>;

struct RankStateDict {
  std::filesystem::path file;
  std::vector<std::string> names;  // state-dict order
  std::map<std::string, RankValue> values;

  // Whether any value is a DTensor or a ShardedTensor (a per-rank save, not a whole model).
  bool holds_distributed_tensors() const;
  // Throws FormatError "<file>: <name>: <problem>".
  [[noreturn]] void fail(const std::string& name, const std::string& problem) const;
};

// Reads a torch.save file whose root is a dict of tensors. Throws FormatError naming the file and key when a
// value is no tensor, a name is saved twice, or a DTensor or ShardedTensor cannot be read.
RankStateDict read_rank_state_dict(io::FileSet& files, const std::filesystem::path& path);

// What a plain tensor saved by every rank is: rank r's piece of dim 0 (verl's merger concatenates them), or
// the same tensor on every rank (a buffer beside DTensor parameters: rank 0's is served).
enum class PlainTensors { concatenated, replicated };

// Throws FormatError naming the file when a rank's file holds other names than rank 0's.
void check_same_names(const std::vector<RankStateDict>& ranks);

// The plain tensor `name` of every rank merged as `plain` says. Throws FormatError naming the file when a
// rank's is no plain tensor or does not fit rank 0's.
catalog::LogicalTensor merge_plain_tensor(const std::string& name, const std::vector<RankStateDict>& ranks,
                                          PlainTensors plain);

// The merged model of DTensor state dicts (rank r's file holds mesh rank r, row-major, as init_device_mesh
// numbers them), in rank 0's order. Throws FormatError naming the file when ranks disagree on names,
// placements or shapes, the shards do not tile a tensor, or a value is a ShardedTensor.
std::shared_ptr<catalog::Catalog> merge_dtensor_ranks(const std::vector<RankStateDict>& ranks,
                                                      PlainTensors plain);

}  // namespace ckptfs::formats
