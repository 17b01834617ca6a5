// Reading the items of one DCP dir in place: a bytes item's torch.save archive, a tensor item as a
// logical tensor whose boxes are its .distcp chunks. Shared by plain DCP and Megatron's torch_dist.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "ckptfs/catalog.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/torch.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "formats/plain/safetensors_reader.hpp"

namespace ckptfs::dcp {

inline constexpr std::string_view kZstdTransform = "stream.zstd/1";  // torch's ZStandard extension, version 1
inline constexpr const char* kShardingInfoKey = "DCP_SHARDING_INFO";  // a safetensors blob's chunk offsets

class ItemReader {
 public:
  ItemReader(io::FileSet& files, std::filesystem::path dir) : ItemReader(files, dir, dir / ".metadata") {}
  // `metadata_path`: the dir's main metadata file (its .metadata, or __0.metadata of a rank-local save).
  ItemReader(io::FileSet& files, std::filesystem::path dir, std::filesystem::path metadata_path)
      : files_(files), dir_(std::move(dir)), metadata_path_(std::move(metadata_path)) {}

  const std::filesystem::path& metadata_path() const { return metadata_path_; }

  // The torch.save archive at `loc` (a bytes item, or one chunk of a tensor item), decoded first when
  // it was saved through the ZStandard extension. Throws FormatError naming the metadata file and the
  // item when the bytes lie outside the data file or are not a zstd frame; UnsupportedError for other
  // transforms.
  torch::TorchArchive archive(const Item& item, const ItemLocation& loc) const;

  // A tensor item: one box per chunk (a torch.save archive each, or a tensor of the data file's
  // safetensors blob with serialization_format=SAFETENSORS), served in the item's dtype.
  catalog::LogicalTensor tensor(const Item& item) const;

  [[noreturn]] void fail(const Item& item, const std::string& what) const;
  // Whether tensors read so far came from safetensors blobs (serialization_format=SAFETENSORS).
  bool read_safetensors_blobs() const { return !blobs_.empty(); }

 private:
  const std::filesystem::path& metadata_of(const Item& item) const;
  io::FileRange decoded(const Item& item, const ItemLocation& loc, const io::FilePtr& file) const;
  io::FilePtr data_file(const Item& item, const ItemLocation& loc) const;
  bool in_safetensors_blob(const ItemLocation& loc, const io::FilePtr& file) const;
  torch::SourceTensor chunk_source(const Item& item, const Chunk& c) const;
  torch::SourceTensor blob_tensor(const Item& item, const Chunk& c, const io::FilePtr& file) const;

  io::FileSet& files_;
  std::filesystem::path dir_;
  std::filesystem::path metadata_path_;
  mutable std::map<std::pair<const io::File*, uint64_t>, plain::SafetensorsHeader>
      blobs_;  // parsed once per file
};

}  // namespace ckptfs::dcp
