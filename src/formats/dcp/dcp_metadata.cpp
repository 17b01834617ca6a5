#include "formats/dcp/dcp_metadata.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string_view>
#include <unordered_map>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;
using formats::Field;
using pickle::Kind;

namespace {

constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;

bool is_class(const pickle::Value& v, std::string_view name) {
  // The classes moved between modules over torch versions: match the class name in any torch module.
  return v.kind == Kind::Object && v.name == name && v.module.starts_with("torch.distributed");
}

std::string string_of(const Field& f) {
  return f.as_string();
}

ItemLocation location_of(const Field& info) {
  if (!is_class(info.value(), "_StorageInfo"))
    info.fail(fmt::format("expected _StorageInfo, found {}", info.value().describe()));
  ItemLocation loc;
  loc.relative_path = string_of(info["relative_path"]);
  loc.offset = static_cast<uint64_t>(info["offset"].as_int());
  loc.length = static_cast<uint64_t>(info["length"].as_int());
  if (auto t = info["transform_descriptors"]; t.present())
    for (size_t i = 0; i < t.size(); ++i) loc.transforms.push_back(t.at(i).as_string());
  if (loc.relative_path.empty() || loc.relative_path.find('/') != std::string::npos ||
      loc.relative_path == "." || loc.relative_path == "..")
    info.fail(fmt::format("relative_path '{}' is not a file name in the checkpoint dir", loc.relative_path));
  return loc;
}

DType dtype_of(const Field& properties) {
  const pickle::Value& p = properties.value();
  // TensorProperties pickles its state as a tuple (dtype, layout, requires_grad, memory_format,
  // pin_memory); very old versions as a dict with 'dtype'.
  const pickle::Value* dtype = nullptr;
  if (p.state && p.state->kind == Kind::Tuple && !p.state->items.empty()) dtype = p.state->items[0].get();
  if (dtype == nullptr) dtype = p.find("dtype");
  if (dtype == nullptr || dtype->kind != Kind::Global || dtype->module != "torch")
    properties.fail("no torch dtype in TensorProperties");
  auto d = dtype_from_torch_name(dtype->name);
  if (!d)
    throw UnsupportedError(
        fmt::format("{}: dtype torch.{} is not supported", properties.path(), dtype->name));
  return *d;
}

// storage_data is keyed by MetadataIndex(fqn, offset, index): tensor chunks by (fqn, chunk offsets),
// bytes items by fqn with no offset.
using StorageKey = std::pair<std::string, std::optional<std::vector<int64_t>>>;

std::map<StorageKey, ItemLocation> read_storage(const Field& storage) {
  std::map<StorageKey, ItemLocation> out;
  if (!storage.value().is(Kind::Dict)) storage.fail("expected a dict");
  size_t i = 0;
  for (const auto& [key, value] : storage.value().entries) {
    const Field k(key.get(), storage.file(), fmt::format("{}[{}].key", storage.path(), i));
    const Field v(value.get(), storage.file(), fmt::format("{}[{}]", storage.path(), i++));
    if (!is_class(*key, "MetadataIndex"))
      k.fail(fmt::format("expected MetadataIndex, found {}", key->describe()));
    std::optional<std::vector<int64_t>> offset;
    if (k["offset"].present()) offset = k["offset"].as_shape();
    out[{k["fqn"].as_string(), offset}] = location_of(v);
  }
  return out;
}

// planner_data maps each fqn to its nested path; indexed once, as a linear find per item is quadratic
// in the number of items (a 100,000-item .metadata).
using PlannerPaths = std::unordered_map<std::string_view, const pickle::Value*>;

PlannerPaths index_planner_data(const Field& planner_data) {
  PlannerPaths out;
  if (!planner_data.present() || !planner_data.value().is(Kind::Dict)) return out;
  for (const auto& [key, value] : planner_data.value().entries)
    if (key->is(Kind::String)) out[key->text] = value.get();  // the last of duplicate keys wins, as in Python
  return out;
}

std::vector<pickle::ValuePtr> planner_path(const PlannerPaths& paths, const std::string& fqn) {
  const auto found = paths.find(fqn);
  if (found == paths.end()) return {};
  const pickle::Value* path = found->second;
  if (path->kind != Kind::Tuple && path->kind != Kind::List) return {};
  for (const auto& p : path->items)
    if (!p->is(Kind::String) && !p->is(Kind::Int)) return {};
  return path->items;
}

}  // namespace

Metadata read_metadata(const io::Source& source, const fs::path& file) {
  // The size (fstat of the opened file) is checked before anything is read.
  const auto opened = source.open(file);
  if (opened->size() > kMaxMetadataBytes)
    throw FormatError(fmt::format("{}: larger than 1 GiB", file.string()));
  const std::vector<std::byte> bytes = opened->read(0, opened->size());
  pickle::ValuePtr root;
  try {
    root = pickle::unpickle(bytes);
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", file.string(), e.what()));
  }
  const Field md(root.get(), &file, "");
  if (!is_class(*root, "Metadata"))
    md.fail(fmt::format("not DCP metadata: the pickle holds {}", root->describe()));
  const auto storage = read_storage(md["storage_data"]);
  const PlannerPaths planner_paths = index_planner_data(md["planner_data"]);
  Metadata out;
  if (auto v = md["version"]; v.present()) out.version = v.as_string();
  const Field items = md["state_dict_metadata"];
  if (!items.value().is(Kind::Dict)) items.fail("expected a dict");
  for (const auto& [fqn, entry] : items.items()) {
    Item item;
    item.fqn = fqn;
    item.metadata_file = file;
    item.path = planner_path(planner_paths, fqn);
    const pickle::Value& v = entry.value();
    if (is_class(v, "BytesStorageMetadata")) {
      auto it = storage.find({fqn, std::nullopt});
      if (it == storage.end()) entry.fail("bytes item without a storage_data entry");
      item.location = it->second;
    } else if (is_class(v, "TensorStorageMetadata")) {
      item.is_tensor = true;
      item.dtype = dtype_of(entry["properties"]);
      item.size = entry["size"].as_shape();
      const Field chunks = entry["chunks"];
      for (size_t c = 0; c < chunks.size(); ++c) {
        Chunk chunk;
        chunk.offsets = chunks.at(c)["offsets"].as_shape();
        chunk.sizes = chunks.at(c)["sizes"].as_shape();
        auto it = storage.find({fqn, chunk.offsets});
        if (it == storage.end())
          chunks.at(c).fail(
              fmt::format("chunk at [{}] has no storage_data entry", fmt::join(chunk.offsets, ", ")));
        chunk.location = it->second;
        item.chunks.push_back(std::move(chunk));
      }
    } else {
      throw UnsupportedError(
          fmt::format("{}: {}: unknown metadata class {}", file.string(), entry.path(), v.describe()));
    }
    out.items.push_back(std::move(item));
  }
  out.files = {file};
  return out;
}

}  // namespace ckptfs::dcp
