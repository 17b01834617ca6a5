#include "torch/zip_format.hpp"

#include <fmt/format.h>

#include <map>

#include "ckptfs/error.hpp"
#include "torch/tensor_builder.hpp"
#include "torch/zip_index.hpp"

namespace ckptfs::torch {

bool is_zip_file(const io::FileRange& file) {
  if (file.size() < 4) return false;
  const auto head = file.read(0, 4);
  return head[0] == std::byte{'P'} && head[1] == std::byte{'K'} && head[2] == std::byte{3} &&
         head[3] == std::byte{4};
}

namespace {

// Over an object store each local header is a GET of its own (eight per ZeRO optimizer file). In an archive
// whose data.pkl (its header read anyway) sits where torch's writer puts it, each record is placed by that
// writer's rule and its header checked at the first read of its bytes, in the GET that fetches them
// (io::File::expect); a record the rule does not cover is located by its header.
std::vector<RecordSpan> place_as_torch_writes(const io::FileRange& file, const ZipIndex& index,
                                              const std::vector<const ZipEntry*>& records) {
  std::vector<RecordSpan> out(records.size());
  std::vector<const ZipEntry*> unplaced;
  std::vector<size_t> unplaced_at;
  for (size_t i = 0; i < records.size(); ++i) {
    if (auto placed = index.torch_placement(file, *records[i])) {
      out[i] = placed->span;
      if (placed->span.size > 0) file.file()->expect(std::move(placed->header));
    } else {
      unplaced.push_back(records[i]);
      unplaced_at.push_back(i);
    }
  }
  const std::vector<RecordSpan> located = index.locate_all(file, unplaced);
  for (size_t k = 0; k < located.size(); ++k) out[unplaced_at[k]] = located[k];
  return out;
}

}  // namespace

pickle::ValuePtr read_zip(const io::FileRange& file) {
  const ZipIndex index = ZipIndex::read(file);
  if (index.find("constants.pkl"))
    throw UnsupportedError("a TorchScript archive (constants.pkl), not a torch.save file");
  const ZipEntry* data_pkl = index.find("data.pkl");
  if (!data_pkl) throw FormatError(fmt::format("no record '{}/data.pkl' in the zip archive", index.root()));
  const RecordSpan pickle_span = index.locate(file, *data_pkl);
  const auto pickle_bytes = file.read(pickle_span.offset, pickle_span.size);

  TensorBuilder builder;
  pickle::ValuePtr root;
  try {
    root = pickle::unpickle(pickle_bytes, builder.options());
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(fmt::format("data.pkl: {}", e.what()));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("data.pkl: {}", e.what()));
  }
  // Every storage's record located at once: over an object store, nearby headers in one request.
  std::vector<const ZipEntry*> records;
  std::map<std::string, size_t> record_of;  // storage key -> its place in records
  for (const auto& [key, root_storage] : builder.storages()) {
    const ZipEntry* record = index.find("data/" + key);
    if (!record)
      throw FormatError(fmt::format("storage '{}' has no record '{}/data/{}'", key, index.root(), key));
    record_of.emplace(key, records.size());
    records.push_back(record);
  }
  const auto pickle_placed = index.torch_placement(file, *data_pkl);
  const bool torch_layout = pickle_placed && pickle_placed->span.offset == pickle_span.offset;
  const std::vector<RecordSpan> spans = file.file()->is_remote() && torch_layout
                                            ? place_as_torch_writes(file, index, records)
                                            : index.locate_all(file, records);
  builder.resolve([&](const std::string& key, const RootStorage& root_storage) {
    const size_t i = record_of.at(key);
    const ZipEntry* record = records[i];
    const RecordSpan& span = spans[i];
    if (span.size != root_storage.nbytes)
      throw FormatError(fmt::format("record '{}' holds {} bytes but storage '{}' is {} x {} ({} bytes)",
                                    record->name, span.size, key, root_storage.numel,
                                    dtype_torch_name(root_storage.dtype), root_storage.nbytes));
    return StorageSpan{file.file(), file.base() + span.offset, span.size};
  });
  return root;
}

}  // namespace ckptfs::torch
