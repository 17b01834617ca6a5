// verl save dirs: a tag per global_step_N dir, the tracker's step served at the root; in each tag the
// actor's views at the root and every other role's (critic) under <role>/.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <re2/re2.h>

#include <algorithm>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/verl.hpp"
#include "formats/dtensor.hpp"
#include "formats/model_selection.hpp"
#include "formats/save_dir.hpp"
#include "formats/verl/role_dir.hpp"
#include "formats/verl/steps.hpp"

namespace ckptfs::verl {

namespace fs = std::filesystem;
using formats::verl::RoleDir;

namespace {

using formats::verl::is_step_name;

std::vector<fs::path> role_dirs(const io::Source& source, const fs::path& step) {
  return formats::sorted_subdirs(source, step,
                                 [&](const fs::path& d) { return formats::verl::is_role_dir(source, d); });
}

bool is_step_dir(const io::Source& source, const fs::path& dir) {
  return is_step_name(dir.filename().string()) && !role_dirs(source, dir).empty();
}

std::string describe_role(const RoleDir& role) {
  return fmt::format("{}: FSDP{}, world size {}, mesh {}", role.name,
                     role.fsdp_version ? std::to_string(*role.fsdp_version) : "?", role.world_size,
                     role.mesh_shape.empty() ? "none (plain tensors)"
                                             : formats::mesh_string(role.mesh_shape, role.mesh_dim_names));
}

// The served model: verl's model_merger casts every tensor to bfloat16; float32 ones are (round to nearest
// even, as torch does), the others keep their dtype (float16: a note says so).
std::shared_ptr<catalog::Catalog> bf16_model(const catalog::Catalog& parameters) {
  auto out = std::make_shared<catalog::Catalog>(parameters);
  for (auto& t : out->tensors)
    if (t.dtype == DType::F32) t.dtype = DType::BF16;
  return out;
}

// config.json as the merger's save_pretrained writes it beside its bfloat16 weights: the saved file with
// its "dtype" ("torch_dtype" before transformers 4.56) values set to "bfloat16", every other byte kept.
std::string bf16_config(const io::Source& source, const fs::path& path) {
  const auto read = source.read_small_file(path, uint64_t{64} << 20);
  if (!read) throw SourceError(fmt::format("{}: cannot read", path.string()));
  std::string text = *read;
  // RE2, not std::regex: std::regex recurses per character and overflows the stack on a long value.
  static const RE2 kDtype(R"re(("(?:torch_)?dtype"\s*:\s*)"[A-Za-z0-9_.]+")re");
  RE2::GlobalReplace(&text, kDtype, R"(\1"bfloat16")");
  return text;
}

// A role's catalogs and files in `tag`: its views at the root, or in its own folder (critic/).
void add_role(const io::Source& source, Tag& tag, const RoleDir& role, bool at_root) {
  const std::string prefix = at_root ? "" : role.name + "/";
  for (const auto& t : role.parameters->tensors)
    if (t.dtype == DType::F16)
      tag.notes.push_back(
          fmt::format("{}: {} is float16, served as float16 in {}model.safetensors (verl's merger "
                      "casts it to bfloat16)",
                      role.name, t.name, prefix));
  const std::string folder = at_root ? "" : role.name;
  tag.add(ViewRole::model, bf16_model(*role.parameters), folder);
  tag.add(ViewRole::fp32, formats::upcast_to_fp32(*role.parameters), folder);
  for (const auto& f : role.hf_files) {
    if (f.filename() == "config.json")
      tag.extra_files.push_back(
          {.path = prefix + "config.json", .bytes = WrittenText{bf16_config(source, f)}});
    else
      tag.extra_files.push_back({.path = prefix + f.filename().string(), .bytes = PassedThrough{f}});
  }
  tag.files.insert(tag.files.end(), role.files.begin(), role.files.end());
  tag.files.insert(tag.files.end(), role.hf_files.begin(), role.hf_files.end());
  for (const auto& n : role.notes) tag.notes.push_back(fmt::format("{}: {}", role.name, n));
  tag.notes.push_back(
      fmt::format("{} ({}): {}", describe_role(role), prefix.empty() ? "the root" : prefix, role.optimizer));
}

// One saved step: the actor (else the first role) at the root, every other role under <role>/.
Tag read_step(io::FileSet& files, const std::string& name, const fs::path& dir,
              const std::vector<fs::path>& roles) {
  Tag tag;
  tag.name = name;
  tag.dir = dir;
  std::vector<RoleDir> read;
  for (const auto& r : roles) read.push_back(formats::verl::read_role_dir(files, r));
  auto root = std::find_if(read.begin(), read.end(), [](const RoleDir& r) { return r.name == "actor"; });
  if (root == read.end()) root = read.begin();
  add_role(files.source(), tag, *root, true);
  for (auto it = read.begin(); it != read.end(); ++it)
    if (it != root) add_role(files.source(), tag, *it, false);
  const RoleDir& main = *root;
  std::vector<std::string> names;
  for (const auto& r : read) names.push_back(r.name);
  tag.format =
      fmt::format("verl FSDP{} checkpoint (FSDPCheckpointManager), roles {}",
                  main.fsdp_version ? std::to_string(*main.fsdp_version) : "", fmt::join(names, ", "));
  tag.topology.dp = main.world_size;
  tag.topology.optimizer = main.optimizer;
  for (const auto& t : main.parameters->tensors)
    if (dtype_is_floating(t.dtype)) {
      tag.topology.train_dtype = t.dtype;
      break;
    }
  tag.notes.push_back(
      "model.safetensors: every tensor cast to bfloat16 as verl's model_merger writes it; fp32/: "
      "the saved parameters in float32");
  return tag;
}

// A tag: its step dir (or the one role dir given as SRC) and its role dirs.
struct Step {
  fs::path dir;
  std::vector<fs::path> roles;
};

}  // namespace

bool is_verl_source(const io::Source& source, const fs::path& root) {
  // step dirs by name first: no other framework's subdirs are listed
  return formats::verl::is_role_dir(source, root) || is_step_dir(source, root) ||
         !formats::sorted_subdirs(source, root, [&](const fs::path& d) {
            return is_step_dir(source, d);
          }).empty();
}

Checkpoint open(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  formats::SaveDir<Step> save_dir("verl", root,
                                  "no verl checkpoint (global_step_N/actor/model_world_size_W_rank_R.pt)");
  auto& steps = save_dir.tags;
  if (formats::verl::is_role_dir(source, root)) {
    // one role dir: the tag is its step (global_step_N/actor/) when it has one
    const std::string parent = root.parent_path().filename().string();
    steps.emplace_back(is_step_name(parent) ? parent : root.filename().string(), Step{root, {root}});
  } else if (is_step_dir(source, root)) {
    steps.emplace_back(root.filename().string(), Step{root, role_dirs(source, root)});
  } else {
    for (const auto& d :
         formats::sorted_subdirs(source, root, [&](const fs::path& d) { return is_step_dir(source, d); }))
      steps.emplace_back(d.filename().string(), Step{d, role_dirs(source, d)});
  }
  // the tracker is read only beside step dirs: without any, the error says they are missing
  if (!steps.empty()) save_dir.tracked = formats::verl::tracked_step(source, root);
  return formats::open_save_dir(source, std::move(save_dir), options,
                                [](io::FileSet& files, const std::string& name, const Step& step) {
                                  return read_step(files, name, step.dir, step.roles);
                                });
}

}  // namespace ckptfs::verl
