// The .metadata pickle of a PyTorch Distributed Checkpoint (torch.distributed.checkpoint), read without
// torch: every item with its dtype, size and chunks (tensors) or as a pickled value (bytes items), where
// each chunk's bytes sit, and the nested path each flattened key came from (docs/formats/dcp.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckptfs/dtype.hpp"
#include "ckptfs/pickle.hpp"

namespace ckptfs::dcp {

// Where one item (a tensor chunk or a bytes item) is stored: [offset, offset + length) of a data file.
struct ItemLocation {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transforms;  // stream transforms (compression), outermost last
};

struct Chunk {
  std::vector<int64_t> offsets, sizes;
  ItemLocation location;
};

struct Item {
  std::string fqn;                      // the flattened key, as written (dots inside names stay)
  std::vector<pickle::ValuePtr> path;   // planner_data: the nested keys (str) and list indexes (int)
  bool is_tensor = false;
  DType dtype = DType::F32;             // tensors
  std::vector<int64_t> size;            // tensors
  std::vector<Chunk> chunks;            // tensors
  ItemLocation location;                // bytes items
};

struct Metadata {
  std::vector<Item> items;  // in state_dict_metadata order
  std::string version;      // empty before torch 2.6-ish
};

// Reads `dir`/.metadata. Throws FormatError naming the file (and the item) when the pickle is not DCP
// metadata, a tensor chunk has no storage entry, or a field has the wrong type; UnsupportedError for a
// metadata class or dtype ckptfs does not know.
Metadata read_metadata(const std::filesystem::path& file);

}  // namespace ckptfs::dcp
