#include "formats/dcp/dcp_items.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckptfs/error.hpp"
#include "io/decoded_item.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;

namespace {

// A torch.save item starts with a zip local header. With serialization_format=SAFETENSORS a data
// file's tensor items all point at one safetensors blob (its 8-byte header length, then '{').
bool starts_with_zip(const io::FileRange& range) {
  if (range.size() < 4) return false;
  const auto head = range.read(0, 4);
  return head[0] == std::byte{'P'} && head[1] == std::byte{'K'} && head[2] == std::byte{3} && head[3] == std::byte{4};
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

torch::TorchArchive ItemReader::archive(const Item& item, const ItemLocation& loc) const {
  const fs::path path = dir_ / loc.relative_path;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(item, fmt::format("its data file {} is missing", path.string()));
  const io::FilePtr file = files_.open(path);
  if (loc.offset > file->size() || loc.length > file->size() - loc.offset)
    fail(item, fmt::format("bytes {}..{} lie outside {} ({} bytes)", loc.offset, loc.offset + loc.length,
                           path.string(), file->size()));
  if (!loc.transforms.empty()) return torch::TorchArchive::open(decoded(item, loc, file));
  const io::FileRange range(file, loc.offset, loc.length);
  if (!starts_with_zip(range) && safetensors_header_at(*file, loc.offset))
    throw UnsupportedError(fmt::format("{}: item {} is stored in {} in DCP's SAFETENSORS serialization "
                                       "format, which ckptfs does not read yet",
                                       metadata_of(item).string(), item.fqn, path.string()));
  return torch::TorchArchive::open(range);
}

// An item saved through DCP's ZStandard extension (transform 'stream.zstd/1'): one zstd frame of the
// usual torch.save archive, read through an io::DecodedItem.
io::FileRange ItemReader::decoded(const Item& item, const ItemLocation& loc, const io::FilePtr& file) const {
  if (loc.transforms != std::vector<std::string>{std::string(kZstdTransform)})
    throw UnsupportedError(fmt::format("{}: item {} is stored through transforms '{}', which ckptfs does not "
                                       "read (it reads '{}')",
                                       metadata_of(item).string(), item.fqn, fmt::join(loc.transforms, "', '"),
                                       kZstdTransform));
  try {
    return io::FileRange(io::File::decoded(io::DecodedItem::zstd(file, loc.offset, loc.length)));
  } catch (const FormatError& e) {
    fail(item, e.what());
  }
}

catalog::LogicalTensor ItemReader::tensor(const Item& item) const {
  std::vector<catalog::Box> boxes;
  for (const Chunk& c : item.chunks) {
    const auto held = archive(item, c.location);
    const torch::SourceTensor* src = torch::as_tensor(held.root().get());
    if (src == nullptr)
      fail(item, fmt::format("the chunk at {} holds a {}, not a tensor", c.location.relative_path, held.root()->describe()));
    if (src->dtype != item.dtype)
      fail(item, fmt::format("a chunk in {} holds {}, the metadata says {}", c.location.relative_path,
                             dtype_torch_name(src->dtype), dtype_torch_name(item.dtype)));
    boxes.push_back({c.offsets, c.sizes, *src, nullptr});
  }
  try {
    return catalog::assembled_tensor(item.fqn, item.dtype, item.size, std::move(boxes),
                                     fmt::format("{} chunks", item.chunks.size()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", metadata_of(item).string(), e.what()));
  }
}

}  // namespace ckptfs::dcp
