// torch.distributed._shard.sharded_tensor.ShardedTensor values of a torch.save file, read as data (FSDP1's
// LOCAL_STATE_DICT saves each unit's flat parameter as one). The pickle is
// `_rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor, (ShardedTensor, dtype, size, ...),
// ([Shard(tensor, ShardMetadata)], ShardedTensorMetadata(shards_metadata, size, tensor_properties),
// ProcessGroupState, ChunkShardingSpec, init_rrefs))`: this rank's local shards and every rank's placement.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "ckptfs/torch.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::formats {

// Where one rank's shard sits in the global tensor.
struct ShardPlacement {
  std::vector<int64_t> offsets, sizes;
  int64_t rank = 0;
  bool operator==(const ShardPlacement&) const = default;
};

struct LocalShard {
  ShardPlacement placement;
  torch::SourceTensor tensor;
};

struct ShardedTensorValue {
  DType dtype = DType::F32;
  std::vector<int64_t> global_size;
  std::vector<ShardPlacement> shards;  // the metadata: every rank's shard (ranks that hold none have none)
  std::vector<LocalShard> local;       // the shards this file holds
  int64_t rank = 0, world_size = 0;    // the saving rank and its process group's size (ProcessGroupState)
};

// The ShardedTensor `field` holds, or nullopt when it holds something else. Validates what one file can
// tell: the metadata's shards tile the global size exactly (1-D: FSDP's chunks), at most one shard per
// rank, every rank below the world size, each local shard one of the metadata's (the saving rank's, with
// that shape and the tensor's dtype). Throws FormatError naming the file and key otherwise.
std::optional<ShardedTensorValue> as_sharded_tensor(const Field& field);

}  // namespace ckptfs::formats
