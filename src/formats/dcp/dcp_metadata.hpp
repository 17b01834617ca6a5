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
#include "ckptfs/io_tree.hpp"
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
  std::string fqn;                     // the flattened key, as written (dots inside names stay)
  std::vector<pickle::ValuePtr> path;  // planner_data: the nested keys (str) and list indexes (int)
  bool is_tensor = false;
  DType dtype = DType::F32;             // tensors
  std::vector<int64_t> size;            // tensors
  std::vector<Chunk> chunks;            // tensors
  ItemLocation location;                // bytes items
  std::filesystem::path metadata_file;  // the metadata file that declared it (errors name it)
};

struct Metadata {
  std::vector<Item> items;                   // in state_dict_metadata order
  std::string version;                       // empty before torch 2.6-ish
  std::vector<std::filesystem::path> files;  // the metadata files read
};

// Reads `dir`/.metadata. Throws FormatError naming the file (and the item) when the pickle is not DCP
// metadata, a tensor chunk has no storage entry, or a field has the wrong type; UnsupportedError for a
// metadata class or dtype ckptfs does not know.
Metadata read_metadata(const io::Source& source, const std::filesystem::path& file);

// The metadata files of a DCP dir: its .metadata or, saved with use_collectives=False, one __<rank>.metadata
// per rank (in rank order, each describing only that rank's items); empty when there is none.
std::vector<std::filesystem::path> metadata_files(const io::Source& source, const std::filesystem::path& dir);
bool is_rank_metadata_name(const std::string& file_name);

// Every item of a DCP dir: its .metadata, or the per-rank files merged (rank_metadata.cpp): an item
// several ranks hold (replicated) is taken from the lowest rank, after checking that they agree on
// kind, dtype and size (FormatError naming both files otherwise); a tensor's chunks are the union over
// the ranks. SourceError when the dir has no metadata file.
Metadata read_dir_metadata(const io::Source& source, const std::filesystem::path& dir);

}  // namespace ckptfs::dcp
