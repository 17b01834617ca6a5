#include "formats/dcp/hf_storage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/json_file.hpp"
#include "formats/model_selection.hpp"
#include "formats/natural_order.hpp"
#include "formats/parallel_reads.hpp"
#include "formats/plain/safetensors_reader.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;
using catalog::Catalog;

namespace {

constexpr std::string_view kShardingInfoKey = "DCP_SHARDING_INFO";  // _hf_utils.CUSTOM_METADATA_KEY
constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kShardedDir = "sharded";  // where the shards go when the writer consolidates
constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;
constexpr int64_t kMaxExtent = int64_t{1} << 48;  // per dimension: offset + size never overflows

std::vector<fs::path> safetensors_files_in(const io::Source& source, const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& entry : source.list_directory(dir))
    if (entry.is_file && entry.path.extension() == ".safetensors") out.push_back(entry.path);
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return natural_less(a.filename().string(), b.filename().string());
  });
  return out;
}

// One rank's chunk of a tensor: a whole safetensors tensor placed at `offsets` of the global tensor.
struct RankChunk {
  std::vector<int64_t> offsets;
  torch::SourceTensor source;
  fs::path file;
};

struct ChunkedTensor {
  std::string fqn;
  std::vector<RankChunk> chunks;
};

// DCP_SHARDING_INFO, '{"<fqn>": {"saved_offsets": [...]}, ...}' (a JSON text inside the string-valued
// __metadata__), in the order the writer lists the tensors: the state dict's.
std::vector<std::pair<std::string, std::vector<int64_t>>> sharding_info(const fs::path& file,
                                                                        const std::string& text) {
  const auto fail = [&](const std::string& what) {
    throw FormatError(fmt::format("{}: __metadata__ {}: {}", file.string(), kShardingInfoKey, what));
  };
  nlohmann::ordered_json info;
  try {
    info = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("not JSON: {}", e.what()));
  }
  if (!info.is_object()) fail("not a JSON object");
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [fqn, entry] : info.items()) {
    const auto offsets = entry.is_object() ? entry.find("saved_offsets") : entry.end();
    if (offsets == entry.end() || !offsets->is_array())
      fail(fmt::format("{} has no saved_offsets list", fqn));
    std::vector<int64_t> o;
    for (const auto& v : *offsets) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxExtent)
        fail(fmt::format("{}: saved_offsets {} are not offsets", fqn, offsets->dump()));
      o.push_back(v.get<int64_t>());
    }
    out.emplace_back(fqn, std::move(o));
  }
  return out;
}

// One file's tensors, each with the offsets it is placed at: where DCP_SHARDING_INFO says (every tensor must
// be listed there, and only those), or 0 when the file has none (a full tensor, as HuggingFaceStorageReader
// reads it).
struct PlacedFile {
  fs::path path;
  std::vector<std::pair<plain::SafetensorsEntry, std::vector<int64_t>>> tensors;
};

PlacedFile read_placed_file(io::FileSet& files, const fs::path& path) {
  auto header = plain::read_safetensors_header(files.open(path));
  PlacedFile out{path, {}};
  const auto it = header.metadata.find(std::string(kShardingInfoKey));
  if (it == header.metadata.end()) {
    for (auto& e : header.tensors) {
      std::vector<int64_t> zeros(e.tensor.shape.size(), 0);
      out.tensors.emplace_back(std::move(e), std::move(zeros));
    }
    return out;
  }
  std::map<std::string, const plain::SafetensorsEntry*> by_name;
  for (const auto& e : header.tensors) by_name[e.name] = &e;
  std::set<std::string> listed;
  for (auto& [fqn, offsets] : sharding_info(path, it->second)) {
    listed.insert(fqn);
    if (!by_name.contains(fqn))
      throw FormatError(
          fmt::format("{}: {} lists {}, which the file does not hold", path.string(), kShardingInfoKey, fqn));
    if (offsets.size() != by_name[fqn]->tensor.shape.size())
      throw FormatError(fmt::format("{}: {} gives {} {} offsets, the tensor has {} dimensions", path.string(),
                                    kShardingInfoKey, fqn, offsets.size(),
                                    by_name[fqn]->tensor.shape.size()));
    out.tensors.emplace_back(*by_name[fqn], std::move(offsets));
  }
  for (const auto& e : header.tensors)
    if (!listed.contains(e.name))
      throw FormatError(
          fmt::format("{}: tensor {} is missing from {}", path.string(), e.name, kShardingInfoKey));
  return out;
}

// The chunks of every file, per tensor in the order the files first list them.
std::vector<ChunkedTensor> chunked_tensors(io::FileSet& files, const std::vector<fs::path>& paths) {
  std::vector<ChunkedTensor> out;
  std::map<std::string, size_t> slot_of;
  for (auto& file : formats::read_all(paths, [&](const fs::path& p) { return read_placed_file(files, p); }))
    for (auto& [entry, offsets] : file.tensors) {
      auto [slot, inserted] = slot_of.try_emplace(entry.name, out.size());
      if (inserted) out.push_back({entry.name, {}});
      out[slot->second].chunks.push_back({std::move(offsets), std::move(entry.tensor), file.path});
    }
  return out;
}

std::string file_names(const ChunkedTensor& t) {
  std::vector<std::string> names;
  for (const auto& c : t.chunks) names.push_back(c.file.filename().string());
  return fmt::format("{}", fmt::join(names, ", "));
}

// The global tensor: its shape is not recorded anywhere, so it is the chunks' extent (as
// HuggingFaceStorageReader and consolidate_safetensors_files compute it); the chunks must then tile it.
catalog::LogicalTensor assemble(const ChunkedTensor& t, const fs::path& dir) {
  const RankChunk& first = t.chunks.front();
  std::vector<int64_t> shape(first.offsets.size(), 0);
  std::vector<catalog::Box> boxes;
  for (const auto& c : t.chunks) {
    if (c.source.dtype != first.source.dtype || c.offsets.size() != shape.size())
      throw FormatError(fmt::format("{}: {} is {} [{}] there, {} [{}] in {}", c.file.string(), t.fqn,
                                    dtype_torch_name(c.source.dtype), fmt::join(c.source.shape, ", "),
                                    dtype_torch_name(first.source.dtype), fmt::join(first.source.shape, ", "),
                                    first.file.filename().string()));
    for (size_t d = 0; d < shape.size(); ++d) shape[d] = std::max(shape[d], c.offsets[d] + c.source.shape[d]);
    boxes.push_back({.offsets = c.offsets, .sizes = c.source.shape, .source = c.source, .inner = nullptr});
  }
  uint64_t numel = 1;  // offsets come from JSON: the extent they make must stay addressable
  for (int64_t d : shape) {
    if (d != 0 && numel > (uint64_t{1} << 62) / static_cast<uint64_t>(d))
      throw FormatError(fmt::format("{} ({}): {}: the chunks' extent [{}] is too large", dir.string(),
                                    file_names(t), t.fqn, fmt::join(shape, ", ")));
    numel *= static_cast<uint64_t>(d);
  }
  if (t.chunks.size() == 1 && shape == first.source.shape)
    return catalog::whole_tensor(t.fqn, first.source, first.source.dtype, "saved tensor in " + file_names(t));
  try {
    return catalog::assembled_tensor(t.fqn, first.source.dtype, std::move(shape), std::move(boxes),
                                     fmt::format("{} chunks in {}", t.chunks.size(), file_names(t)));
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{} ({}): {}", dir.string(), file_names(t), e.what()));
  }
}

// model.safetensors.index.json, when there is one: every file its weight_map names must be there and hold
// the tensor it is named for (HF loaders open the files through it).
void check_index(const io::Source& source, const fs::path& index, const std::vector<ChunkedTensor>& tensors) {
  const nlohmann::json j = formats::read_json_object(source, index, kMaxIndexBytes);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw FormatError(fmt::format("{}: no weight_map object", index.string()));
  std::map<std::string, const ChunkedTensor*> by_fqn;
  for (const auto& t : tensors) by_fqn[t.fqn] = &t;
  for (const auto& [fqn, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw FormatError(fmt::format("{}: weight_map[{}] is not a file name", index.string(), fqn));
    const std::string name = file.get<std::string>();
    if (name.find('/') != std::string::npos || !source.is_file(index.parent_path() / name))
      throw FormatError(
          fmt::format("{}: weight_map puts {} in {}, which is missing", index.string(), fqn, name));
    const auto it = by_fqn.find(fqn);
    const bool held =
        it != by_fqn.end() && std::any_of(it->second->chunks.begin(), it->second->chunks.end(),
                                          [&](const RankChunk& c) { return c.file.filename() == name; });
    if (!held)
      throw FormatError(
          fmt::format("{}: weight_map puts {} in {}, which does not hold it", index.string(), fqn, name));
  }
}

// The ranks that wrote shard-<R>-model-... files (R counts from 1). The global shapes are only the chunks'
// extent, so a lost rank's file would go unnoticed where its chunks were the last rows: every rank up to
// the highest must have written one.
int rank_count(const fs::path& data_dir, const std::vector<fs::path>& data_files) {
  static const std::regex kShard(R"(shard-(\d{1,9})-model-\d+-of-\d+\.safetensors)");
  std::set<int> ranks;
  for (const auto& f : data_files) {
    std::smatch m;
    const std::string name = f.filename().string();
    if (std::regex_match(name, m, kShard)) ranks.insert(std::stoi(m[1].str()));
  }
  if (ranks.empty()) return 1;
  for (int r = 1; r <= *ranks.rbegin(); ++r)
    if (!ranks.contains(r))
      throw FormatError(
          fmt::format("{}: shard-{:05d}-model-*.safetensors is missing (a rank's chunks), "
                      "shard-{:05d}-model-*.safetensors is there",
                      data_dir.string(), r, *ranks.rbegin()));
  return static_cast<int>(ranks.size());
}

// Which of the writer's layouts the dir holds, for `ckptfs inspect`.
std::string layout_name(const io::Source& source, const fs::path& dir, const fs::path& data_dir,
                        const std::vector<ChunkedTensor>& tensors) {
  if (data_dir != dir) return "distributed shards in sharded/, not consolidated";
  const bool sharded = std::any_of(tensors.begin(), tensors.end(), [](const ChunkedTensor& t) {
    return t.chunks.size() > 1 || std::any_of(t.chunks[0].offsets.begin(), t.chunks[0].offsets.end(),
                                              [](int64_t o) { return o != 0; });
  });
  if (sharded) return "distributed shards (save_distributed=True)";
  if (source.is_directory(dir / kShardedDir))
    return "consolidated (consolidate_safetensors_files; sharded/ not read)";
  return "full tensors (rank-0 save)";
}

}  // namespace

bool is_hf_storage_dir(const io::Source& source, const fs::path& dir) {
  return source.is_directory(dir) && (!safetensors_files_in(source, dir).empty() ||
                                      !safetensors_files_in(source, dir / kShardedDir).empty());
}

Tag read_hf_storage_tag(io::FileSet& files, const fs::path& dir, const std::string& name) {
  // Consolidated files, when there are any, are what HuggingFaceStorageReader reads; sharded/ then holds
  // the same tensors again and is left alone.
  fs::path data_dir = dir;
  std::vector<fs::path> data_files = safetensors_files_in(files.source(), dir);
  if (data_files.empty()) {
    data_dir = dir / kShardedDir;
    data_files = safetensors_files_in(files.source(), data_dir);
  }
  Tag tag;
  tag.topology.dp = rank_count(data_dir, data_files);
  const std::vector<ChunkedTensor> chunked = chunked_tensors(files, data_files);
  tag.name = name;
  tag.dir = dir;
  tag.format = "PyTorch DCP Hugging Face storage (HuggingFaceStorageWriter): " +
               layout_name(files.source(), dir, data_dir, chunked);
  tag.files = data_files;
  if (const fs::path index = dir / kIndexName; files.source().is_file(index)) {
    check_index(files.source(), index, chunked);
    tag.files.push_back(index);
  }
  auto model = std::make_shared<Catalog>();
  for (const auto& t : chunked) model->tensors.push_back(assemble(t, dir));
  if (model->tensors.empty())
    throw FormatError(fmt::format("{}: its safetensors files hold no tensor", data_dir.string()));
  for (const auto& t : model->tensors)
    if (dtype_is_floating(t.dtype)) {
      tag.topology.train_dtype = t.dtype;
      break;
    }
  tag.topology.optimizer = "-";
  if (data_dir == dir && files.source().is_directory(dir / kShardedDir))
    tag.notes.push_back("sharded/ is not read: the consolidated files beside it hold the same tensors");
  tag.add(ViewRole::fp32, formats::upcast_to_fp32(*model));
  tag.add(ViewRole::model, std::move(model));
  // The dir's other files (the index, config.json, ...), beside the views (a name a view takes moves to
  // source/).
  tag.side_files = formats::side_files(files.source(), dir, [&](const std::string& file) {
    return std::find(data_files.begin(), data_files.end(), dir / file) != data_files.end();
  });
  return tag;
}

Checkpoint open_hf_storage(const io::Source& source, const fs::path& dir, const OpenOptions& options) {
  formats::SaveDir<fs::path> save_dir("dcp", dir);
  save_dir.tags.emplace_back(dir.filename().string(), dir);
  return formats::open_save_dir(source, std::move(save_dir), options,
                                [](io::FileSet& files, const std::string& name, const fs::path& tag_dir) {
                                  return read_hf_storage_tag(files, tag_dir, name);
                                });
}

}  // namespace ckptfs::dcp
