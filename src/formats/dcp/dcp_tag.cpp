#include "formats/dcp/dcp_tag.hpp"

#include <fmt/format.h>

#include <regex>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/torch.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "formats/dcp/nested_state.hpp"
#include "formats/model_selection.hpp"
#include "formats/value_tensors.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;
using catalog::Catalog;
using catalog::LogicalTensor;

namespace {

std::string key_string(const pickle::Value& k) {
  return k.is(pickle::Kind::Int) ? std::to_string(k.integer) : k.text;
}

// The nested keys of an item: planner_data's path, or the flattened key itself when there is none.
std::vector<pickle::ValuePtr> path_of(const Item& item) {
  if (!item.path.empty()) return item.path;
  auto k = pickle::make_value(pickle::Kind::String);
  k->text = item.fqn;
  return {k};
}

struct Reader {
  io::FileSet& files;
  fs::path dir;  // the DCP dir
  fs::path metadata_path;

  [[noreturn]] void fail(const Item& item, const std::string& what) const {
    throw FormatError(fmt::format("{}: item {}: {}", metadata_path.string(), item.fqn, what));
  }

  // The torch.save archive an item's bytes hold, read in place from its data file.
  torch::TorchArchive archive(const Item& item, const ItemLocation& loc) const {
    if (!loc.transforms.empty())
      throw UnsupportedError(fmt::format("{}: item {} is stored through transform '{}' (compression), which "
                                         "ckptfs does not read",
                                         metadata_path.string(), item.fqn, loc.transforms.front()));
    const fs::path path = dir / loc.relative_path;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) fail(item, fmt::format("its data file {} is missing", path.string()));
    const io::FilePtr file = files.open(path);
    if (loc.offset > file->size() || loc.length > file->size() - loc.offset)
      fail(item, fmt::format("bytes {}..{} lie outside {} ({} bytes)", loc.offset, loc.offset + loc.length,
                             path.string(), file->size()));
    const io::FileRange range(file, loc.offset, loc.length);
    if (!starts_with_zip(range) && safetensors_header_at(*file, loc.offset))
      throw UnsupportedError(fmt::format("{}: item {} is stored in {} in DCP's SAFETENSORS serialization "
                                         "format, which ckptfs does not read yet",
                                         metadata_path.string(), item.fqn, path.string()));
    return torch::TorchArchive::open(range);
  }

  // A torch.save item starts with a zip local header. With serialization_format=SAFETENSORS a data
  // file's tensor items all point at one safetensors blob (its 8-byte header length, then '{').
  static bool starts_with_zip(const io::FileRange& range) {
    if (range.size() < 4) return false;
    const auto head = range.read(0, 4);
    return head[0] == std::byte{'P'} && head[1] == std::byte{'K'} && head[2] == std::byte{3} && head[3] == std::byte{4};
  }
  static bool safetensors_header_at(const io::File& file, uint64_t offset) {
    return offset <= file.size() && file.size() - offset > 8 && file.read(offset + 8, 1)[0] == std::byte{'{'};
  }

  LogicalTensor tensor(const Item& item) const {
    std::vector<catalog::Box> boxes;
    for (const Chunk& c : item.chunks) {
      const auto held = archive(item, c.location);
      const torch::SourceTensor* src = torch::as_tensor(held.root().get());
      if (src == nullptr) fail(item, fmt::format("the chunk at {} holds a {}, not a tensor", c.location.relative_path, held.root()->describe()));
      if (src->dtype != item.dtype)
        fail(item, fmt::format("a chunk in {} holds {}, the metadata says {}", c.location.relative_path,
                               dtype_torch_name(src->dtype), dtype_torch_name(item.dtype)));
      boxes.push_back({c.offsets, c.sizes, *src});
    }
    LogicalTensor t;
    t.name = item.fqn;
    t.dtype = item.dtype;
    t.shape = item.size;
    t.origin = fmt::format("{} chunks", item.chunks.size());
    try {
      t.boxes = std::make_shared<catalog::BoxAssembly>(item.fqn, item.size, std::move(boxes));
      catalog::validate(t);
    } catch (const FormatError& e) {
      throw FormatError(fmt::format("{}: {}", metadata_path.string(), e.what()));
    }
    return t;
  }
};

// The model tensors of a DCP dir's state dict (formats::select_model's rule, on the planner paths).
std::shared_ptr<Catalog> model_catalog(const std::vector<Item>& items, const Catalog& state,
                                       const fs::path& metadata_path) {
  std::vector<formats::StateEntry> entries;
  size_t k = 0;
  for (const auto& item : items) {
    if (!item.is_tensor) continue;
    formats::StateEntry e;
    for (const auto& key : path_of(item)) e.path.push_back(key_string(*key));
    e.tensor = &state.tensors[k++];
    entries.push_back(std::move(e));
  }
  return formats::select_model(entries, metadata_path);
}

bool is_model_dir(const fs::path& dir) {
  const std::string name = dir.filename().string();
  return name.starts_with("pytorch_model") || name.starts_with("model");
}

// Data-parallel ranks that wrote files: the distinct r of __<r>_<n>.distcp.
int rank_count(const fs::path& dir) {
  static const std::regex kDataFile(R"(__(\d+)_\d+\.distcp)");
  std::set<std::string> ranks;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kDataFile)) ranks.insert(m[1].str());
  }
  return std::max<int>(1, static_cast<int>(ranks.size()));
}

}  // namespace

Tag read_tag(io::FileSet& files, const fs::path& dir, const std::string& name, const std::vector<fs::path>& dcp_dirs) {
  Tag tag;
  tag.name = name;
  tag.dir = dir;
  tag.format = "PyTorch distributed checkpoint (torch.distributed.checkpoint)";
  tag.topology.optimizer = "in full_state.pt";
  const fs::path* model_dir = &dcp_dirs.front();
  for (const auto& d : dcp_dirs)
    if (is_model_dir(d)) {
      model_dir = &d;
      break;
    }
  for (const auto& d : dcp_dirs) {
    Reader reader{files, d, d / ".metadata"};
    const Metadata md = read_metadata(reader.metadata_path);
    auto state = std::make_shared<Catalog>();   // every tensor item
    std::vector<CatalogPtr> keep_alive = {state};  // and one catalog per bytes item holding tensors
    for (const auto& item : md.items)
      if (item.is_tensor) state->tensors.push_back(reader.tensor(item));
    NestedState nested;
    size_t next_tensor = 0;
    for (const auto& item : md.items) {
      pickle::ValuePtr value;
      if (item.is_tensor) {
        value = catalog::tensor_value(state->tensors[next_tensor++]);
      } else {
        // Its own catalog: TensorValues point into it, so it must not grow once the item is rebound.
        auto values = std::make_shared<Catalog>();
        value = formats::with_logical_tensors(reader.archive(item, item.location).root(), *values, item.fqn);
        if (!values->tensors.empty()) keep_alive.push_back(std::move(values));
      }
      try {
        nested.set(path_of(item), std::move(value));
      } catch (const FormatError& e) {
        reader.fail(item, fmt::format("planner path: {}", e.what()));
      }
    }
    const std::string state_path =
        dcp_dirs.size() == 1 ? "full_state.pt" : fmt::format("full_state/{}.pt", d.filename().string());
    tag.state_files.push_back({state_path, nested.root(), std::move(keep_alive)});
    tag.files.push_back(reader.metadata_path);
    std::set<fs::path> data_files;
    for (const auto& t : state->tensors)
      for (const auto& f : t.files()) data_files.insert(f->path());
    tag.files.insert(tag.files.end(), data_files.begin(), data_files.end());
    tag.topology.dp = std::max(tag.topology.dp, rank_count(d));
    const std::string role = dcp_dirs.size() == 1 ? "state" : "state/" + d.filename().string();
    if (&d == model_dir) {
      auto model = model_catalog(md.items, *state, reader.metadata_path);
      for (const auto& t : model->tensors)
        if (dtype_is_floating(t.dtype)) {
          tag.topology.train_dtype = t.dtype;
          break;
        }
      tag.catalogs.emplace("fp32", formats::upcast_to_fp32(*model));
      tag.catalogs.emplace("model", std::move(model));
    }
    tag.catalogs.emplace(role, std::move(state));
  }
  return tag;
}

}  // namespace ckptfs::dcp
