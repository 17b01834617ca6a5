// FSDP per-rank save dirs: a tag per folder of rank files (the folder given, or HF Trainer's checkpoint-N
// dirs below it), each rank group's model merged: flat parameters cut by config.json's architecture, DTensors
// placed by their placements.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <regex>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/fsdp.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/overloaded.hpp"
#include "formats/fsdp/flat_units.hpp"
#include "formats/fsdp/optimizer_shapes.hpp"
#include "formats/fsdp/rank_files.hpp"
#include "formats/fsdp/unit_cut.hpp"
#include "formats/fsdp/unit_parameters.hpp"
#include "formats/hf_layout.hpp"
#include "formats/parallel_reads.hpp"
#include "formats/rank_state_dict.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::fsdp {

namespace fs = std::filesystem;
using formats::HfLayout;
using formats::RankStateDict;
using formats::fsdp::FlatUnit;
using formats::fsdp::RankFiles;

namespace {

// Every rank's state dict of a group; nullopt when rank 0's holds no DTensor or ShardedTensor (not a
// per-rank model: an optimizer's or other state so named).
std::optional<std::vector<RankStateDict>> read_group(io::FileSet& files, const RankFiles& group) {
  RankStateDict first = formats::read_rank_state_dict(files, group.files[0]);
  if (!first.holds_distributed_tensors()) return std::nullopt;
  std::vector<fs::path> rest(group.files.begin() + 1, group.files.end());
  std::vector<RankStateDict> ranks;
  ranks.push_back(std::move(first));
  for (auto& r :
       formats::read_all(rest, [&](const fs::path& p) { return formats::read_rank_state_dict(files, p); }))
    ranks.push_back(std::move(r));
  // the world rank 0 saved in (a ShardedTensor's process group, a DTensor's mesh): a missing last rank file
  // is named, not found as a mismatch later
  for (const auto& name : ranks[0].names) {
    const auto world =
        std::visit(Overloaded{[](const torch::SourceTensor&) { return int64_t{0}; },
                              [](const formats::ShardedTensorValue& t) { return t.world_size; },
                              [](const formats::DTensorShard& d) {
                                return formats::mesh_ranks(d.mesh_shape, int64_t{1} << 30);
                              }},
                   ranks[0].values.at(name));
    if (world > static_cast<int64_t>(ranks.size()))
      throw FormatError(
          fmt::format("{}: missing ({}'s {} was saved by a world of {} ranks)",
                      (group.files[0].parent_path() /
                       fmt::format("{}{}{}", group.stem, ranks.size(), group.files[0].extension().string()))
                          .string(),
                      group.files[0].filename().string(), name, world));
    if (world > 0) break;
  }
  return ranks;
}

std::string describe_cut(const formats::fsdp::CutUnit& u) {
  return fmt::format(
      "FSDP unit {}: {} parameters ({} .. {}), {} elements, each aligned to {} element{}, {} of padding",
      u.unit->key, u.parameters.size(), u.parameters.front().name, u.parameters.back().name, u.unit->numel,
      u.alignment, u.alignment == 1 ? "" : "s", u.padding);
}

// An FSDP1 LOCAL_STATE_DICT model: the flat parameters cut into the model's parameters, or each served whole.
std::shared_ptr<catalog::Catalog> flat_model(io::FileSet& files, const std::vector<RankStateDict>& ranks,
                                             const std::variant<HfLayout, std::string>& config,
                                             const fs::path& optimizer_dir, const OpenOptions& options,
                                             Tag& tag) {
  const auto units = formats::fsdp::gather_flat_units(ranks);
  std::shared_ptr<catalog::Catalog> model;
  const auto optimizer = formats::fsdp::read_optimizer_record(files, optimizer_dir);
  auto known =
      formats::fsdp::unit_parameters(units, ranks[0], config, optimizer, optimizer_dir, options, tag.notes);
  std::set<std::string> pieces;  // the names the rank files give the parameters' pieces (use_orig_params)
  for (const auto& u : units)
    for (const auto& p : u.pieces) pieces.insert(p.name);
  if (auto* found = std::get_if<formats::fsdp::UnitParameters>(&known)) {
    auto cut = formats::fsdp::cut_units(units, found->parameters, found->prefix,
                                        static_cast<int64_t>(ranks.size()), found->source);
    if (auto* ok = std::get_if<std::vector<formats::fsdp::CutUnit>>(&cut)) {
      model = formats::fsdp::cut_model(*ok, found->parameters, found->prefix);
      for (const auto& p : found->parameters)
        pieces.insert(found->prefix + p.name);  // an empty piece views no chunk
      tag.notes.push_back("the flat parameters are cut by " + found->source);
      for (const auto& u : *ok) tag.notes.push_back(describe_cut(u));
    } else {
      known = std::get<std::string>(cut);
    }
  }
  if (!model) {
    model = std::make_shared<catalog::Catalog>();
    for (const auto& u : units)
      model->tensors.push_back(formats::fsdp::flat_slice(u, u.key, {u.numel}, 0, "the whole flat parameter"));
    tag.notes.push_back(
        fmt::format("model.safetensors holds each FSDP unit's whole flat parameter (1-D, as saved) "
                    "under its key: the parameters' names and shapes are in no rank file, and {}",
                    std::get<std::string>(known)));
    for (const auto& u : units)
      tag.notes.push_back(fmt::format("FSDP unit {}: {} elements, served whole", u.key, u.numel));
  }
  formats::check_same_names(ranks);
  size_t skipped = 0;
  for (const auto& name : ranks[0].names) {
    if (formats::fsdp::is_flat_param_key(name)) continue;
    if (pieces.contains(name)) {  // the flat parameters hold the same elements
      ++skipped;
      continue;
    }
    model->tensors.push_back(formats::merge_plain_tensor(name, ranks, formats::PlainTensors::replicated));
  }
  if (skipped > 0)
    tag.notes.push_back(
        fmt::format("{} original parameters' per-rank pieces (use_orig_params) not served: the flat "
                    "parameters hold the same elements",
                    skipped));
  return model;
}

// A model of DTensor state dicts (FSDP2, FSDP1 with a device mesh): placed by their placements, buffers
// (plain tensors) served as rank 0 saved them.
std::shared_ptr<catalog::Catalog> dtensor_model(const std::vector<RankStateDict>& ranks, Tag& tag) {
  auto model = formats::merge_dtensor_ranks(ranks, formats::PlainTensors::replicated);
  for (const auto& name : ranks[0].names)
    if (const auto* d = std::get_if<formats::DTensorShard>(&ranks[0].values.at(name))) {
      tag.notes.push_back(fmt::format("DTensors over mesh {}, e.g. {} {}",
                                      formats::mesh_string(d->mesh_shape, d->mesh_dim_names), name,
                                      formats::placement_string(d->placements)));
      break;
    }
  return model;
}

bool all_float32(const catalog::Catalog& model) {
  return std::all_of(model.tensors.begin(), model.tensors.end(),
                     [](const auto& t) { return !dtype_is_floating(t.dtype) || t.dtype == DType::F32; });
}

// The folder a group's model is served in: the first group at the root, accelerate's further models
// (pytorch_model_fsdp_1_rank{R}.bin) in a folder named by their files ("pytorch_model_fsdp_1").
std::string folder_of(const RankFiles& group, bool first) {
  if (first) return "";
  std::string stem = group.stem;
  while (!stem.empty() && (stem.back() == '_' || stem.back() == '-')) stem.pop_back();
  if (stem.ends_with("rank")) stem.resize(stem.size() - 4);
  while (!stem.empty() && (stem.back() == '_' || stem.back() == '-')) stem.pop_back();
  return stem.empty() ? group.stem : stem;
}

Tag read_tag(io::FileSet& files, const std::string& name, const fs::path& dir, const fs::path& root,
             const OpenOptions& options) {
  Tag tag;
  tag.name = name;
  tag.dir = dir;
  const auto config = formats::layout_in(files.source(), formats::config_files(options, dir, root));
  const std::variant<HfLayout, std::string> no_config = "config.json describes the first model only";
  std::set<std::string> model_files;
  std::vector<std::string> kinds;
  for (const auto& group : formats::fsdp::rank_file_groups(files.source(), dir)) {
    auto ranks = read_group(files, group);
    if (!ranks) continue;
    const bool flat = std::any_of(ranks->at(0).values.begin(), ranks->at(0).values.end(), [](const auto& v) {
      return std::holds_alternative<formats::ShardedTensorValue>(v.second);
    });
    const std::string folder = folder_of(group, kinds.empty());
    // names keep any wrapper prefix here: strip_wrapper_prefixes takes it off every format's model
    const fs::path optimizer_dir = dir / fmt::format("optimizer_{}", kinds.size());  // accelerate's
    CatalogPtr served =
        flat ? flat_model(files, *ranks, kinds.empty() ? config : no_config, optimizer_dir, options, tag)
             : dtensor_model(*ranks, tag);
    if (all_float32(*served)) tag.add(ViewRole::fp32, served, folder);
    tag.add(ViewRole::model, served, folder);
    kinds.push_back(fmt::format("{} ({}, {} ranks{})", group.pattern,
                                flat ? "FSDP1 LOCAL_STATE_DICT flat parameters" : "DTensors", ranks->size(),
                                folder.empty() ? "" : ", served in " + folder + "/"));
    for (const auto& f : group.files) {
      tag.files.push_back(f);
      model_files.insert(f.filename().string());
    }
    tag.topology.dp = static_cast<int>(ranks->size());
    for (const auto& t : served->tensors)
      if (dtype_is_floating(t.dtype)) {
        tag.topology.train_dtype = t.dtype;
        break;
      }
  }
  if (kinds.empty())
    throw FormatError(fmt::format(
        "{}: its rank files hold no DTensor or ShardedTensor (no per-rank model save)", dir.string()));
  tag.format = fmt::format("FSDP per-rank save: {}", fmt::join(kinds, "; "));
  for (size_t i = 0; i < kinds.size(); ++i)
    if (files.source().is_directory(dir / fmt::format("optimizer_{}", i)))
      tag.notes.push_back(
          fmt::format("optimizer_{}/: the optimizer's DCP checkpoint (accelerate), not served", i));
  tag.side_files =
      formats::side_files(files.source(), dir, [&](const std::string& n) { return model_files.contains(n); });
  return tag;
}

// Whether the rank files of `dir` are a per-rank model: a group whose rank-0 file holds DTensors or
// ShardedTensors, or cannot be read (open then names it: such a dir is never served as something else, such
// as the optimizer's DCP dir beside accelerate's model files). Other per-rank files (a DCP dir's
// dataloader_rank{R}.pt) leave the dir to the other adapters.
bool holds_rank_model(const io::Source& source, const fs::path& dir) {
  io::FileSet files(source);
  try {
    for (const auto& group : formats::fsdp::rank_file_groups(source, dir))
      if (formats::read_rank_state_dict(files, group.files[0]).holds_distributed_tensors()) return true;
  } catch (const Error&) {
    return true;
  }
  return false;
}

}  // namespace

bool is_fsdp_source(const io::Source& source, const fs::path& root) {
  if (formats::fsdp::has_rank_files(source, root)) return holds_rank_model(source, root);
  const auto dirs = formats::sorted_subdirs(
      source, root, [&](const fs::path& d) { return formats::fsdp::has_rank_files(source, d); });
  return std::any_of(dirs.begin(), dirs.end(),
                     [&](const fs::path& d) { return holds_rank_model(source, d); });
}

Checkpoint open(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  formats::SaveDir<fs::path> save_dir("fsdp", root, "no per-rank model files (NAME_rank{R}.pt, .bin)");
  if (formats::fsdp::has_rank_files(source, root)) {
    save_dir.tags.emplace_back(root.filename().string(), root);
  } else {
    for (const auto& d : formats::sorted_subdirs(
             source, root, [&](const fs::path& d) { return formats::fsdp::has_rank_files(source, d); }))
      save_dir.tags.emplace_back(d.filename().string(), d);
    save_dir.side_files = formats::side_files(source, root, [](const std::string&) { return false; });
    // HF Trainer writes trainer_state.json into checkpoint-N/ after the model and the optimizer
    save_dir.complete = [&](const std::string& name, const fs::path& dir) {
      static const std::regex kTrainerStep(R"(checkpoint-\d+)");
      return !std::regex_match(name, kTrainerStep) || source.exists(dir / "trainer_state.json");
    };
  }
  return formats::open_save_dir(source, std::move(save_dir), options,
                                [&](io::FileSet& files, const std::string& name, const fs::path& dir) {
                                  return read_tag(files, name, dir, root, options);
                                });
}

}  // namespace ckptfs::fsdp
