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

pickle::ValuePtr read_zip(const io::FileRange& file) {
  const ZipIndex index = ZipIndex::read(file);
  if (index.find("constants.pkl"))
    throw UnsupportedError("a TorchScript archive (constants.pkl), not a torch.save file");
  const ZipEntry* data_pkl = index.find("data.pkl");
  if (!data_pkl) throw FormatError(fmt::format("no record '{}/data.pkl' in the zip archive", index.root()));
  const auto pickle_bytes = index.read(file, *data_pkl);

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
  const std::vector<RecordSpan> spans = index.locate_all(file, records);
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
