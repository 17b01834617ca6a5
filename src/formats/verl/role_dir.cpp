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
#include "formats/dtensor.hpp"
#include "formats/parallel_reads.hpp"
#include "formats/pickle_access.hpp"
#include "formats/rank_state_dict.hpp"
#include "formats/save_dir.hpp"
#include "formats/verl/steps.hpp"

namespace ckptfs::formats::verl {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;  // fsdp_config.json: a few bytes

const std::regex kModelFile(R"(model_world_size_(\d{1,6})_rank_(\d{1,6})\.pt)");

fs::path rank_file(const fs::path& dir, std::string_view kind, int world_size, int rank) {
  return dir / fmt::format("{}_world_size_{}_rank_{}.pt", kind, world_size, rank);
}

// The world size the model files are named with; every rank 0..W-1 must have its file.
int model_world_size(const io::Source& source, const fs::path& dir) {
  std::map<int, std::set<int>> ranks;  // world size -> ranks
  for (const auto& entry : source.list_directory(dir)) {
    std::smatch m;
    const std::string name = entry.path.filename().string();
    if (std::regex_match(name, m, kModelFile)) ranks[std::stoi(m[1].str())].insert(std::stoi(m[2].str()));
  }
  if (ranks.empty())
    throw FormatError(fmt::format("{}: no model_world_size_W_rank_R.pt files", dir.string()));
  if (ranks.size() > 1)
    throw FormatError(fmt::format("{}: model files of several world sizes ({} and {})", dir.string(),
                                  ranks.begin()->first, ranks.rbegin()->first));
  const auto& [world_size, present] = *ranks.begin();
  for (int r = 0; r < world_size; ++r)
    if (!present.contains(r))
      throw FormatError(fmt::format("{}: missing (world size {}: every rank 0..{} saves its model file)",
                                    rank_file(dir, "model", world_size, r).string(), world_size,
                                    world_size - 1));
  if (*present.rbegin() >= world_size)
    throw FormatError(fmt::format("{}: rank {} beyond world size {}",
                                  rank_file(dir, "model", world_size, *present.rbegin()).string(),
                                  *present.rbegin(), world_size));
  return world_size;
}

// fsdp_config.json ({"FSDP_version": 1|2, "world_size": W}, written by rank 0): checked against the files.
std::optional<int> read_fsdp_config(const io::Source& source, const fs::path& dir, int world_size) {
  const fs::path path = dir / "fsdp_config.json";
  const auto text = source.read_small_file(path, kMaxConfigBytes);
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

// The other per-rank files (optimizer, extra state) either exist for every rank or for none.
std::vector<fs::path> rank_files(const io::Source& source, const fs::path& dir, std::string_view kind,
                                 int world_size) {
  std::vector<fs::path> out;
  for (int r = 0; r < world_size; ++r)
    if (source.is_file(rank_file(dir, kind, world_size, r)))
      out.push_back(rank_file(dir, kind, world_size, r));
  if (!out.empty() && out.size() != static_cast<size_t>(world_size))
    for (int r = 0; r < world_size; ++r)
      if (!source.is_file(rank_file(dir, kind, world_size, r)))
        throw FormatError(fmt::format("{}: missing ({} of {} ranks saved their {} file)",
                                      rank_file(dir, kind, world_size, r).string(), out.size(), world_size,
                                      kind));
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
      if (as_dtensor(Field(value.get(), &archive.file()->path(), key->text)))
        dtensors = true;
      else if (torch::as_tensor(*value))
        dtensors = false;
    }
  }
  const char* layout = !dtensors   ? "no tensors"
                       : *dtensors ? "DTensors sharded like the parameters"
                                   : "plain tensors (FSDP1: each rank's piece of the flattened parameters)";
  return fmt::format("torch.optim state_dict per rank, rank 0: {} parameter states {{{}}}, {}; not served",
                     state.value().entries.size(), fmt::join(keys, ", "), layout);
}

std::vector<fs::path> huggingface_files(const io::Source& source, const fs::path& dir,
                                        std::vector<std::string>& notes) {
  return formats::side_files(source, dir / "huggingface", [&](const std::string& name) {
    // save_contents "hf_model" adds the whole model: our model.safetensors takes its place
    const bool weights =
        name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json") || name.ends_with(".bin");
    if (weights)
      notes.push_back(
          fmt::format("huggingface/{} not served: model.safetensors is merged from the shards", name));
    return weights;
  });
}

}  // namespace

bool is_role_dir(const io::Source& source, const fs::path& dir) {
  static const std::regex kVerlFile(
      R"((optim|extra_state)_world_size_\d{1,6}_rank_\d{1,6}\.pt|fsdp_config\.json)");
  bool model = false, verl = false;
  for (const auto& entry : source.list_directory(dir)) {
    const std::string name = entry.path.filename().string();
    model = model || std::regex_match(name, kModelFile);
    verl = verl || std::regex_match(name, kVerlFile) || (name == "huggingface" && entry.is_directory);
  }
  // model files alone are any per-rank save so named (formats/fsdp): verl writes more beside them, or the
  // role dir sits in its global_step_N dir
  return model && (verl || is_step_name(dir.parent_path().filename().string()));
}

RoleDir read_role_dir(io::FileSet& files, const fs::path& dir) {
  RoleDir role;
  role.name = dir.filename().string();
  role.dir = dir;
  role.world_size = model_world_size(files.source(), dir);
  role.fsdp_version = read_fsdp_config(files.source(), dir, role.world_size);
  std::vector<fs::path> model_files;
  for (int r = 0; r < role.world_size; ++r)
    model_files.push_back(rank_file(dir, "model", role.world_size, r));
  const auto ranks = read_all(model_files, [&](const fs::path& p) { return read_rank_state_dict(files, p); });
  role.parameters = merge_dtensor_ranks(ranks, PlainTensors::concatenated);
  for (const auto& name : ranks[0].names)
    if (const auto* dt = std::get_if<DTensorShard>(&ranks[0].values.at(name))) {
      role.mesh_shape = dt->mesh_shape;
      role.mesh_dim_names = dt->mesh_dim_names;
      break;
    }
  role.files = model_files;
  const auto optim = rank_files(files.source(), dir, "optim", role.world_size);
  const auto extra = rank_files(files.source(), dir, "extra_state", role.world_size);
  role.files.insert(role.files.end(), optim.begin(), optim.end());
  role.files.insert(role.files.end(), extra.begin(), extra.end());
  if (files.source().exists(dir / "fsdp_config.json")) role.files.push_back(dir / "fsdp_config.json");
  role.optimizer = optim.empty() ? "not saved" : describe_optimizer(files, optim.front());
  role.hf_files = huggingface_files(files.source(), dir, role.notes);
  return role;
}

}  // namespace ckptfs::formats::verl
