#include "formats/verl/role_dir.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/torch.hpp"
#include "formats/parallel_reads.hpp"
#include "formats/pickle_access.hpp"
#include "formats/save_dir.hpp"
#include "formats/verl/dtensor.hpp"

namespace ckptfs::formats::verl {

namespace fs = std::filesystem;
using catalog::Box;
using catalog::LogicalTensor;

namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;  // fsdp_config.json: a few bytes

const std::regex kModelFile(R"(model_world_size_(\d{1,6})_rank_(\d{1,6})\.pt)");

fs::path rank_file(const fs::path& dir, std::string_view kind, int world_size, int rank) {
  return dir / fmt::format("{}_world_size_{}_rank_{}.pt", kind, world_size, rank);
}

// The world size the model files are named with; every rank 0..W-1 must have its file.
int model_world_size(const fs::path& dir) {
  std::map<int, std::set<int>> ranks;  // world size -> ranks
  for (const auto& entry : io::list_directory(dir)) {
    std::smatch m;
    const std::string name = entry.path.filename().string();
    if (std::regex_match(name, m, kModelFile)) ranks[std::stoi(m[1].str())].insert(std::stoi(m[2].str()));
  }
  if (ranks.empty()) throw FormatError(fmt::format("{}: no model_world_size_W_rank_R.pt files", dir.string()));
  if (ranks.size() > 1)
    throw FormatError(fmt::format("{}: model files of several world sizes ({} and {})", dir.string(),
                                  ranks.begin()->first, ranks.rbegin()->first));
  const auto& [world_size, present] = *ranks.begin();
  for (int r = 0; r < world_size; ++r)
    if (!present.contains(r))
      throw FormatError(fmt::format("{}: missing (world size {}: every rank 0..{} saves its model file)",
                                    rank_file(dir, "model", world_size, r).string(), world_size, world_size - 1));
  if (*present.rbegin() >= world_size)
    throw FormatError(fmt::format("{}: rank {} beyond world size {}",
                                  rank_file(dir, "model", world_size, *present.rbegin()).string(),
                                  *present.rbegin(), world_size));
  return world_size;
}

// fsdp_config.json ({"FSDP_version": 1|2, "world_size": W}, written by rank 0): checked against the files.
std::optional<int> read_fsdp_config(const fs::path& dir, int world_size) {
  const fs::path path = dir / "fsdp_config.json";
  const auto text = io::read_small_file(path, kMaxConfigBytes);
  if (!text) return std::nullopt;
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("{}: not JSON ({})", path.string(), e.what()));
  }
  if (!cfg.is_object() || !cfg.contains("world_size") || !cfg["world_size"].is_number_integer())
    throw FormatError(fmt::format("{}: no integer world_size", path.string()));
  if (cfg["world_size"].get<int64_t>() != world_size)
    throw FormatError(fmt::format("{}: world_size {}, but the model files are model_world_size_{}_rank_*.pt",
                                  path.string(), cfg["world_size"].get<int64_t>(), world_size));
  if (!cfg.contains("FSDP_version")) return std::nullopt;
  if (!cfg["FSDP_version"].is_number_integer())
    throw FormatError(fmt::format("{}: FSDP_version is not an integer", path.string()));
  return cfg["FSDP_version"].get<int>();
}

// One saved parameter of one rank: a DTensor shard, or (older saves) a plain tensor.
struct RankEntry {
  std::optional<DTensorShard> dtensor;
  torch::SourceTensor tensor;
};

struct RankModel {
  fs::path file;
  std::vector<std::string> names;  // state-dict order
  std::map<std::string, RankEntry> entries;
};

RankModel read_rank_model(io::FileSet& files, const fs::path& path) {
  const auto archive = torch::TorchArchive::open(files.open(path));
  const Field root = root_field(archive);
  RankModel out{path, {}, {}};
  for (const auto& [name, value] : root.items()) {
    RankEntry e;
    e.dtensor = as_dtensor(value);
    if (e.dtensor) e.tensor = e.dtensor->local;
    else e.tensor = value.as_tensor();
    if (!out.entries.emplace(name, std::move(e)).second) value.fail("saved twice");
    out.names.push_back(name);
  }
  return out;
}

// A DTensor parameter from every rank's shard: the ranks at coordinate 0 of each replicated mesh
// dimension place their local tensors at the box their Shard placements give them.
LogicalTensor merge_dtensor(const std::string& name, const std::vector<RankModel>& ranks) {
  const DTensorShard& first = *ranks[0].entries.at(name).dtensor;
  const auto world = static_cast<int64_t>(ranks.size());
  int64_t mesh_size = 1;  // capped past the world size: no overflow, whatever sizes were pickled
  for (auto n : first.mesh_shape) mesh_size = n > world ? world + 1 : std::min(mesh_size * n, world + 1);
  if (mesh_size != world)
    throw FormatError(fmt::format("{}: {}: DTensor mesh {} does not hold the world size of {} ranks",
                                  ranks[0].file.string(), name, mesh_string(first.mesh_shape, first.mesh_dim_names),
                                  world));
  std::vector<Box> boxes;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& entry = ranks[r].entries.at(name);
    const auto fail = [&](const std::string& problem) {
      throw FormatError(fmt::format("{}: {}: {}", ranks[r].file.string(), name, problem));
    };
    if (!entry.dtensor) fail("a plain tensor where rank 0 saved a DTensor");
    const DTensorShard& s = *entry.dtensor;
    if (s.global_shape != first.global_shape || s.placements != first.placements || s.mesh_shape != first.mesh_shape)
      fail(fmt::format("DTensor {} {} on mesh {}, rank 0's is {} {} on mesh {}", fmt::join(s.global_shape, "x"),
                       placement_string(s.placements), mesh_string(s.mesh_shape, s.mesh_dim_names),
                       fmt::join(first.global_shape, "x"), placement_string(first.placements),
                       mesh_string(first.mesh_shape, first.mesh_dim_names)));
    // verl's meshes (init_device_mesh) number ranks row-major: rank r's file holds coordinate r
    const auto coordinate = mesh_coordinate(static_cast<int64_t>(r), s.mesh_shape);
    if (s.coordinate && *s.coordinate != coordinate)
      fail(fmt::format("holds the shard of mesh coordinate ({}), but rank {} is at ({})", fmt::join(*s.coordinate, ", "),
                       r, fmt::join(coordinate, ", ")));
    const LocalBox box = local_box(s.global_shape, s.placements, s.mesh_shape, coordinate);
    if (box.sizes != s.local.shape)
      fail(fmt::format("local shard [{}] at mesh coordinate ({}), but {} of [{}] gives [{}] there (shards do not tile)",
                       fmt::join(s.local.shape, ", "), fmt::join(coordinate, ", "), placement_string(s.placements),
                       fmt::join(s.global_shape, ", "), fmt::join(box.sizes, ", ")));
    if (s.local.dtype != first.local.dtype)
      fail(fmt::format("local tensor of {}, rank 0's is {}", dtype_torch_name(s.local.dtype),
                       dtype_torch_name(first.local.dtype)));
    bool replica = false;  // a copy of what the rank at coordinate 0 of a replicated dimension holds
    for (size_t m = 0; m < s.placements.size(); ++m) replica = replica || (s.placements[m].replicate && coordinate[m] != 0);
    if (!replica) boxes.push_back({.offsets = box.offsets, .sizes = box.sizes, .source = s.local, .inner = nullptr});
  }
  const std::string origin = fmt::format("DTensor {} over mesh {}", placement_string(first.placements),
                                         mesh_string(first.mesh_shape, first.mesh_dim_names));
  try {
    return catalog::assembled_tensor(name, first.local.dtype, first.global_shape, std::move(boxes), origin);
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", ranks[0].file.parent_path().string(), e.what()));
  }
}

// A plain tensor on every rank (no DTensor): the ranks' tensors concatenated on dim 0 in rank order, as
// verl's model_merger does with them.
LogicalTensor merge_plain(const std::string& name, const std::vector<RankModel>& ranks) {
  const auto& first = ranks[0].entries.at(name).tensor;
  if (first.shape.empty()) return catalog::whole_tensor(name, first, first.dtype, "0-d tensor of rank 0");
  std::vector<Box> boxes;
  std::vector<int64_t> shape = first.shape;
  shape[0] = 0;
  for (const auto& rank : ranks) {
    const auto& entry = rank.entries.at(name);
    const auto& t = entry.tensor;
    if (entry.dtensor || t.shape.size() != first.shape.size() ||
        !std::equal(t.shape.begin() + 1, t.shape.end(), first.shape.begin() + 1) || t.dtype != first.dtype)
      throw FormatError(fmt::format("{}: {}: does not concatenate with rank 0's {} [{}] on dim 0", rank.file.string(),
                                    name, dtype_torch_name(first.dtype), fmt::join(first.shape, ", ")));
    std::vector<int64_t> offsets(t.shape.size(), 0);
    offsets[0] = shape[0];
    shape[0] += t.shape[0];
    boxes.push_back({.offsets = offsets, .sizes = t.shape, .source = t, .inner = nullptr});
  }
  return catalog::assembled_tensor(name, first.dtype, shape, std::move(boxes), "plain tensors concatenated on dim 0");
}

std::shared_ptr<catalog::Catalog> merge_ranks(const std::vector<RankModel>& ranks) {
  const std::set<std::string> names(ranks[0].names.begin(), ranks[0].names.end());
  for (const auto& rank : ranks)
    if (std::set<std::string>(rank.names.begin(), rank.names.end()) != names)
      throw FormatError(fmt::format("{}: holds other parameter names than {}", rank.file.string(),
                                    ranks[0].file.filename().string()));
  auto out = std::make_shared<catalog::Catalog>();
  for (const auto& name : ranks[0].names)
    out->tensors.push_back(ranks[0].entries.at(name).dtensor ? merge_dtensor(name, ranks) : merge_plain(name, ranks));
  return out;
}

// The other per-rank files (optimizer, extra state) either exist for every rank or for none.
std::vector<fs::path> rank_files(const fs::path& dir, std::string_view kind, int world_size) {
  std::vector<fs::path> out;
  for (int r = 0; r < world_size; ++r)
    if (io::is_file(rank_file(dir, kind, world_size, r))) out.push_back(rank_file(dir, kind, world_size, r));
  if (!out.empty() && out.size() != static_cast<size_t>(world_size))
    for (int r = 0; r < world_size; ++r)
      if (!io::is_file(rank_file(dir, kind, world_size, r)))
        throw FormatError(fmt::format("{}: missing ({} of {} ranks saved their {} file)",
                                      rank_file(dir, kind, world_size, r).string(), out.size(), world_size, kind));
  return out;
}

// What rank 0's optimizer file holds, described (not served): torch.optim's plain state_dict, per
// parameter index DTensors (FSDP2) or each rank's flat-shard pieces (FSDP1).
std::string describe_optimizer(io::FileSet& files, const fs::path& path) {
  const auto archive = torch::TorchArchive::open(files.open(path));
  const Field state = root_field(archive)["state"];
  if (!state.is_dict()) return fmt::format("{}: no optimizer state dict", path.filename().string());
  std::set<std::string> keys;
  std::optional<bool> dtensors;  // whether the first moment tensor found is a DTensor
  for (const auto& [index, entry] : state.value().entries) {
    if (!entry->is(pickle::Kind::Dict)) continue;
    for (const auto& [key, value] : entry->entries) {
      if (!key->is(pickle::Kind::String)) continue;
      keys.insert(key->text);
      if (key->text == "step" || dtensors) continue;
      if (as_dtensor(Field(value.get(), &archive.file()->path(), key->text))) dtensors = true;
      else if (torch::as_tensor(*value)) dtensors = false;
    }
  }
  const char* layout = !dtensors ? "no tensors"
                       : *dtensors ? "DTensors sharded like the parameters"
                                   : "plain tensors (FSDP1: each rank's piece of the flattened parameters)";
  return fmt::format("torch.optim state_dict per rank, rank 0: {} parameter states {{{}}}, {}; not served",
                     state.value().entries.size(), fmt::join(keys, ", "), layout);
}

std::vector<fs::path> huggingface_files(const fs::path& dir, std::vector<std::string>& notes) {
  return formats::side_files(dir / "huggingface", [&](const std::string& name) {
    // save_contents "hf_model" adds the whole model: our model.safetensors takes its place
    const bool weights = name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json") || name.ends_with(".bin");
    if (weights) notes.push_back(fmt::format("huggingface/{} not served: model.safetensors is merged from the shards", name));
    return weights;
  });
}

}  // namespace

bool is_role_dir(const fs::path& dir) {
  for (const auto& entry : io::list_directory(dir))
    if (std::regex_match(entry.path.filename().string(), kModelFile)) return true;
  return false;
}

RoleDir read_role_dir(io::FileSet& files, const fs::path& dir) {
  RoleDir role;
  role.name = dir.filename().string();
  role.dir = dir;
  role.world_size = model_world_size(dir);
  role.fsdp_version = read_fsdp_config(dir, role.world_size);
  std::vector<fs::path> model_files;
  for (int r = 0; r < role.world_size; ++r) model_files.push_back(rank_file(dir, "model", role.world_size, r));
  const auto ranks = read_all(model_files, [&](const fs::path& p) { return read_rank_model(files, p); });
  role.parameters = merge_ranks(ranks);
  for (const auto& name : ranks[0].names)
    if (const auto& dt = ranks[0].entries.at(name).dtensor) {
      role.mesh_shape = dt->mesh_shape;
      role.mesh_dim_names = dt->mesh_dim_names;
      break;
    }
  role.files = model_files;
  const auto optim = rank_files(dir, "optim", role.world_size);
  const auto extra = rank_files(dir, "extra_state", role.world_size);
  role.files.insert(role.files.end(), optim.begin(), optim.end());
  role.files.insert(role.files.end(), extra.begin(), extra.end());
  if (io::exists(dir / "fsdp_config.json")) role.files.push_back(dir / "fsdp_config.json");
  role.optimizer = optim.empty() ? "not saved" : describe_optimizer(files, optim.front());
  role.hf_files = huggingface_files(dir, role.notes);
  return role;
}

}  // namespace ckptfs::formats::verl
