#include "formats/dcp/dcp_tag.hpp"

#include <fmt/format.h>

#include <regex>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/torch.hpp"
#include "formats/dcp/dcp_items.hpp"
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

// The model tensors of a DCP dir's state dict (formats::select_model's rule, on the planner paths).
std::shared_ptr<Catalog> model_catalog(const std::vector<Item>& items, const CatalogPtr& state,
                                       const fs::path& metadata_path) {
  std::vector<formats::StateEntry> entries;
  size_t k = 0;
  for (const auto& item : items) {
    if (!item.is_tensor) continue;
    formats::StateEntry e;
    for (const auto& key : path_of(item)) e.path.push_back(key_string(*key));
    e.tensor = {state, k++};
    entries.push_back(std::move(e));
  }
  return formats::select_model(entries, metadata_path);
}

bool is_model_dir(const fs::path& dir) {
  const std::string name = dir.filename().string();
  return name.starts_with("pytorch_model") || name.starts_with("model");
}

// Data-parallel ranks that wrote files: the distinct r of __<r>_<n>.distcp.
int rank_count(const io::Source& source, const fs::path& dir) {
  static const std::regex kDataFile(R"(__(\d+)_\d+\.distcp)");
  std::set<std::string> ranks;
  for (const auto& entry : source.list_directory(dir)) {
    std::smatch m;
    const std::string name = entry.path.filename().string();
    if (std::regex_match(name, m, kDataFile)) ranks.insert(m[1].str());
  }
  return std::max<int>(1, static_cast<int>(ranks.size()));
}

// How a DCP dir stores its items, for `inspect`: compression, rank-local metadata.
std::string storage_notes(const Metadata& md) {
  size_t stored = 0, compressed = 0;
  const auto count = [&](const ItemLocation& loc) {
    ++stored;
    if (!loc.transforms.empty()) ++compressed;
  };
  for (const auto& item : md.items) {
    if (!item.is_tensor) count(item.location);
    for (const auto& c : item.chunks) count(c.location);
  }
  std::string out;
  if (compressed > 0)
    out += fmt::format("; {} of {} stored items zstd-compressed (ZStandard extension)", compressed, stored);
  if (md.files.size() > 1 || (md.files.size() == 1 && md.files.front().filename() != ".metadata"))
    out += fmt::format("; rank-local metadata (use_collectives=False): {} __<rank>.metadata files merged",
                       md.files.size());
  return out;
}

}  // namespace

Tag read_tag(io::FileSet& files, const fs::path& dir, const std::string& name,
             const std::vector<fs::path>& dcp_dirs) {
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
    const Metadata md = read_dir_metadata(files.source(), d);
    ItemReader reader(files, d, md.files.front());
    tag.format += storage_notes(md);
    auto state = std::make_shared<Catalog>();  // every tensor item
    for (const auto& item : md.items)
      if (item.is_tensor) state->tensors.push_back(reader.tensor(item));
    if (reader.read_safetensors_blobs())
      tag.format += "; tensors in safetensors blobs (serialization_format=SAFETENSORS)";
    NestedState nested;
    size_t next_tensor = 0;
    for (const auto& item : md.items) {
      pickle::ValuePtr value;
      if (item.is_tensor) {
        value = catalog::tensor_value({state, next_tensor++});
      } else {
        value = formats::with_logical_tensors(reader.archive(item, item.location).root(),
                                              std::make_shared<Catalog>(),
                                              item.fqn);  // its tensors in a catalog of their own
      }
      try {
        nested.set(path_of(item), std::move(value));
      } catch (const FormatError& e) {
        reader.fail(item, fmt::format("planner path: {}", e.what()));
      }
    }
    const std::string state_path =
        dcp_dirs.size() == 1 ? "full_state.pt" : fmt::format("full_state/{}.pt", d.filename().string());
    tag.state_files.push_back({.path = state_path, .value = nested.root()});
    tag.files.insert(tag.files.end(), md.files.begin(), md.files.end());
    std::set<fs::path> data_files;
    for (const auto& t : state->tensors)
      for (const auto& f : t.files()) data_files.insert(f->path());
    tag.files.insert(tag.files.end(), data_files.begin(), data_files.end());
    tag.topology.dp = std::max(tag.topology.dp, rank_count(files.source(), d));
    const std::string role = dcp_dirs.size() == 1 ? "state" : "state/" + d.filename().string();
    if (&d == model_dir) {
      auto model = model_catalog(md.items, state, reader.metadata_path());
      for (const auto& t : model->tensors)
        if (dtype_is_floating(t.dtype)) {
          tag.topology.train_dtype = t.dtype;
          break;
        }
      tag.add(ViewRole::fp32, formats::upcast_to_fp32(*model));
      tag.add(ViewRole::model, std::move(model));
    }
    tag.states.emplace(role, std::move(state));
  }
  return tag;
}

}  // namespace ckptfs::dcp
