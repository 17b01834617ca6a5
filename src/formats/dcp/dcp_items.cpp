#include "formats/dcp/dcp_items.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "io/decoded_item.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;

namespace {

// A torch.save item starts with a zip local header. With serialization_format=SAFETENSORS a data
// file's tensor items all point at one safetensors blob (its 8-byte header length, then '{').
bool starts_with_zip(const io::FileRange& range) {
  if (range.size() < 4) return false;
  const auto head = range.read(0, 4);
  return head[0] == std::byte{'P'} && head[1] == std::byte{'K'} && head[2] == std::byte{3} &&
         head[3] == std::byte{4};
}

bool safetensors_header_at(const io::File& file, uint64_t offset) {
  return offset <= file.size() && file.size() - offset > 8 && file.read(offset + 8, 1)[0] == std::byte{'{'};
}

}  // namespace

const fs::path& ItemReader::metadata_of(const Item& item) const {
  return item.metadata_file.empty() ? metadata_path_ : item.metadata_file;
}

void ItemReader::fail(const Item& item, const std::string& what) const {
  throw FormatError(fmt::format("{}: item {}: {}", metadata_of(item).string(), item.fqn, what));
}

io::FilePtr ItemReader::data_file(const Item& item, const ItemLocation& loc) const {
  const fs::path path = dir_ / loc.relative_path;
  if (!files_.source().is_file(path)) fail(item, fmt::format("its data file {} is missing", path.string()));
  io::FilePtr file = files_.open(path);
  if (loc.offset > file->size() || loc.length > file->size() - loc.offset)
    fail(item, fmt::format("bytes {}..{} lie outside {} ({} bytes)", loc.offset, loc.offset + loc.length,
                           path.string(), file->size()));
  return file;
}

bool ItemReader::in_safetensors_blob(const ItemLocation& loc, const io::FilePtr& file) const {
  return loc.transforms.empty() && !starts_with_zip(io::FileRange(file, loc.offset, loc.length)) &&
         safetensors_header_at(*file, loc.offset);
}

torch::TorchArchive ItemReader::archive(const Item& item, const ItemLocation& loc) const {
  const io::FilePtr file = data_file(item, loc);
  if (!loc.transforms.empty()) return torch::TorchArchive::open(decoded(item, loc, file));
  if (in_safetensors_blob(loc, file))
    fail(item, fmt::format("{} holds a safetensors blob at byte {}, where a torch.save archive should be",
                           file->path().string(), loc.offset));
  return torch::TorchArchive::open(io::FileRange(file, loc.offset, loc.length));
}

// An item saved through DCP's ZStandard extension (transform 'stream.zstd/1'): one zstd frame of the
// usual torch.save archive, read through an io::DecodedItem.
io::FileRange ItemReader::decoded(const Item& item, const ItemLocation& loc, const io::FilePtr& file) const {
  if (loc.transforms != std::vector<std::string>{std::string(kZstdTransform)})
    throw UnsupportedError(
        fmt::format("{}: item {} is stored through transforms '{}', which ckptfs does not "
                    "read (it reads '{}')",
                    metadata_of(item).string(), item.fqn, fmt::join(loc.transforms, "', '"), kZstdTransform));
  try {
    return io::FileRange(io::File::decoded(io::DecodedItem::zstd(file, loc.offset, loc.length)));
  } catch (const FormatError& e) {
    fail(item, e.what());
  }
}

torch::SourceTensor ItemReader::chunk_source(const Item& item, const Chunk& c) const {
  const io::FilePtr file = data_file(item, c.location);
  if (in_safetensors_blob(c.location, file)) return blob_tensor(item, c, file);
  const auto held = archive(item, c.location);
  const torch::SourceTensor* src = torch::as_tensor(held.root().get());
  if (src == nullptr)
    fail(item, fmt::format("the chunk at {} holds a {}, not a tensor", c.location.relative_path,
                           held.root()->describe()));
  return *src;
}

// serialization_format=SAFETENSORS: a rank's data file is its bytes items, then one safetensors blob
// holding its tensor chunks by FQN, where every chunk's offset points (its length is numel x itemsize,
// not the blob's); __metadata__ DCP_SHARDING_INFO gives each chunk's offsets in the whole tensor.
torch::SourceTensor ItemReader::blob_tensor(const Item& item, const Chunk& c, const io::FilePtr& file) const {
  auto [it, fresh] = blobs_.try_emplace({file.get(), c.location.offset});
  if (fresh) {
    try {
      it->second = plain::read_safetensors_blob(
          io::FileRange(file, c.location.offset, file->size() - c.location.offset));
    } catch (const FormatError& e) {
      blobs_.erase(it);
      fail(item, e.what());
    }
  }
  const plain::SafetensorsHeader& blob = it->second;
  const auto entry = std::find_if(blob.tensors.begin(), blob.tensors.end(),
                                  [&](const plain::SafetensorsEntry& e) { return e.name == item.fqn; });
  const std::string where =
      fmt::format("the safetensors blob at byte {} of {}", c.location.offset, file->path().string());
  if (entry == blob.tensors.end()) fail(item, fmt::format("{} has no tensor of that name", where));
  if (entry->tensor.shape != c.sizes)
    fail(item, fmt::format("{} holds it as [{}], the chunk is [{}]", where,
                           fmt::join(entry->tensor.shape, ", "), fmt::join(c.sizes, ", ")));
  if (auto info = blob.metadata.find(kShardingInfoKey); info != blob.metadata.end()) {
    std::vector<int64_t> saved;
    try {
      saved =
          nlohmann::json::parse(info->second).at(item.fqn).at("saved_offsets").get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception& e) {
      fail(item, fmt::format("{}: {} has no saved_offsets for it: {}", where, kShardingInfoKey, e.what()));
    }
    if (saved != c.offsets)
      fail(item, fmt::format("{} says it was saved at [{}], the metadata's chunk is at [{}]", where,
                             fmt::join(saved, ", "), fmt::join(c.offsets, ", ")));
  }
  return entry->tensor;
}

catalog::LogicalTensor ItemReader::tensor(const Item& item) const {
  std::vector<catalog::Box> boxes;
  for (const Chunk& c : item.chunks) {
    const torch::SourceTensor src = chunk_source(item, c);
    if (src.dtype != item.dtype)
      fail(item, fmt::format("a chunk in {} holds {}, the metadata says {}", c.location.relative_path,
                             dtype_torch_name(src.dtype), dtype_torch_name(item.dtype)));
    boxes.push_back({.offsets = c.offsets, .sizes = c.sizes, .source = src, .inner = nullptr});
  }
  try {
    return catalog::assembled_tensor(item.fqn, item.dtype, item.size, std::move(boxes),
                                     fmt::format("{} chunks", item.chunks.size()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", metadata_of(item).string(), e.what()));
  }
}

}  // namespace ckptfs::dcp
