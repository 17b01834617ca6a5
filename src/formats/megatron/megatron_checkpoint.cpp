// Megatron save dirs: a tag per iteration dir, the tracker file's iteration served at the root.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/megatron.hpp"
#include "formats/megatron/hf_model.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/megatron/nemo2_layout.hpp"
#include "formats/megatron/nemo_rl_layout.hpp"
#include "formats/megatron/verl_layout.hpp"
#include "formats/save_dir.hpp"
#include "formats/verl/steps.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";

bool is_iteration_name(const std::string& name) {
  return name == "release" || (name.starts_with("iter_") && name.size() >= 12 &&
                               formats::is_decimal(std::string_view(name).substr(5)));
}

bool is_iteration_dir(const io::Source& source, const fs::path& dir) {
  return is_legacy_iteration(source, dir) || is_torch_dist_iteration(source, dir);
}

std::vector<fs::path> iteration_dirs(const io::Source& source, const fs::path& root) {
  return formats::sorted_subdirs(source, root, [&](const fs::path& d) {
    return is_iteration_name(d.filename().string()) && is_iteration_dir(source, d);
  });
}

// The iteration dir name the tracker names: "release", or iter_%07d of its integer.
std::optional<std::string> tracked_iteration(const io::Source& source, const fs::path& root) {
  const auto tracked = formats::read_tracker(source, root / kTracker);
  if (!tracked) return std::nullopt;
  std::string text = *tracked;
  if (text == "release") return text;
  if (!formats::is_decimal(text))
    throw FormatError(fmt::format("{}: holds '{}', expected an iteration number or 'release'",
                                  (root / kTracker).string(), text.substr(0, 40)));
  // Megatron formats int(text) with %07d: digits as they are, leading zeros dropped, padded to 7 (no integer
  // conversion, so an absurdly long number names a dir that is missing rather than overflowing).
  text.erase(0, std::min(text.find_first_not_of('0'), text.size() - 1));
  return "iter_" + std::string(text.size() < 7 ? 7 - text.size() : 0, '0') + text;
}

// Regular files that are not checkpoint data (tokenizer files, configs beside the checkpoint).
std::vector<fs::path> side_files_of(const io::Source& source, const fs::path& dir) {
  return formats::side_files(source, dir, [](const std::string& name) {
    return name == kTracker || name == "metadata.json" || name == "common.pt" || name == ".metadata" ||
           name.ends_with(".distcp");
  });
}

Iteration read_iteration(io::FileSet& files, const fs::path& dir, const std::string& name) {
  return is_legacy_iteration(files.source(), dir) ? read_legacy_iteration(files, dir, name)
                                                  : read_torch_dist_iteration(files, dir, name);
}

// A Megatron-LM or Megatron-Bridge save dir, or one iteration dir of one.
bool is_megatron_save(const io::Source& source, const fs::path& root) {
  if (is_iteration_dir(source, root) || !iteration_dirs(source, root).empty()) return true;
  // a tracker beside iteration dirs that hold no checkpoint: Megatron's, to say what is missing (verl
  // writes a tracker of the same name beside global_step_N dirs)
  if (!source.is_file(root / kTracker)) return false;
  for (const auto& entry : source.list_directory(root))
    if (entry.is_directory && is_iteration_name(entry.path.filename().string())) return true;
  return false;
}

// Where one tag's files are: its Megatron iteration dir, and what a stack around Megatron wrote beside it
// (NeMo-RL: the step dir's own files, the policy's tokenizer folder; NeMo 2: context/'s files and tokenizer).
struct TagSource {
  fs::path iteration;
  std::string stack;    // the stack's name for inspect ("" where the iteration's format names it)
  std::string weights;  // where the stack keeps the Megatron save, for inspect (policy/weights/)
  std::vector<fs::path> stack_files;
  std::optional<fs::path> tokenizer;
  std::optional<fs::path>
      hf_config;  // the stack's HF config.json, served as hf/config.json (verl's huggingface/)
  std::vector<std::string> notes;  // what of the stack's folder is not served
};

// The iteration a save dir's tracker names, or its last one.
fs::path latest_iteration(const io::Source& source, const fs::path& save) {
  if (is_iteration_dir(source, save) && !source.exists(save / kTracker)) return save;
  const auto dirs = iteration_dirs(source, save);
  if (dirs.empty())
    throw SourceError(
        fmt::format("{}: no Megatron-LM iteration dir (iter_NNNNNNN/ with torch_dist files)", save.string()));
  const auto tracked = tracked_iteration(source, save);
  if (!tracked) return dirs.back();
  if (std::find(dirs.begin(), dirs.end(), save / *tracked) == dirs.end())
    throw FormatError(fmt::format("{}: names iteration dir {}, which is missing or holds no checkpoint",
                                  (save / kTracker).string(), *tracked));
  return save / *tracked;
}

// Megatron-LM's and Megatron-Bridge's save dir (or one iteration dir): a tag per iteration, the tracker's at
// the root. `stack`: the files and tokenizer of a stack's folder around it (NeMo-RL's step dir).
void add_iterations(const io::Source& source, formats::SaveDir<TagSource>& dir, const fs::path& save,
                    const TagSource& stack) {
  const auto tag = [&](const fs::path& iteration) {
    TagSource where = stack;
    where.iteration = iteration;
    return where;
  };
  if (is_iteration_dir(source, save) && !source.exists(save / kTracker)) {
    dir.tags.emplace_back(save.filename().string(), tag(save));
    return;
  }
  for (const auto& d : iteration_dirs(source, save)) dir.tags.emplace_back(d.filename().string(), tag(d));
  // the tracker is read only beside iteration dirs: without any, the error says they are missing
  if (auto tracked = dir.tags.empty() ? std::nullopt : tracked_iteration(source, save))
    dir.tracked = formats::Tracked{save / kTracker, *tracked, "iteration dir"};
}

TagSource nemo_rl_step(const io::Source& source, const fs::path& step) {
  return {.iteration = {},
          .stack = "NeMo-RL step",
          .weights = "policy/weights/",
          .stack_files = side_files_of(source, step),
          .tokenizer = nemo_rl_tokenizer(step),
          .hf_config = {},
          .notes = {}};
}

TagSource nemo2_checkpoint(const io::Source& source, const fs::path& checkpoint) {
  std::vector<fs::path> files = side_files_of(source, checkpoint);
  const auto context = side_files_of(source, checkpoint / "context");
  files.insert(files.end(), context.begin(), context.end());
  // the torch_dist reader names NeMo 2 (it reads context/model.yaml)
  return {.iteration = nemo2_weights(checkpoint),
          .stack = "",
          .weights = "weights/",
          .stack_files = std::move(files),
          .tokenizer = nemo2_tokenizer(source, checkpoint),
          .hf_config = {},
          .notes = {}};
}

// verl's step: the actor's dist_ckpt/ (else the first role's), its transformer_config.json beside it and its
// huggingface/ folder for hf/.
TagSource verl_step(const io::Source& source, const std::vector<fs::path>& roles) {
  const fs::path& role = roles.front();
  TagSource where{.iteration = verl_dist_ckpt(role),
                  .stack = "",  // the torch_dist reader names verl (it reads transformer_config.json)
                  .weights = role.filename().string() + "/dist_ckpt/",
                  .stack_files = side_files_of(source, role),
                  .tokenizer = verl_huggingface(role),
                  .hf_config = verl_huggingface(role) / "config.json",
                  .notes = {}};
  for (size_t i = 1; i < roles.size(); ++i)
    where.notes.push_back(fmt::format("{}/ not served: mount {} itself to read it",
                                      roles[i].filename().string(), roles[i].string()));
  return where;
}

// The tag name of a verl role dir given as SRC: its step's (global_step_N/actor/), else its own.
std::string verl_tag_name(const fs::path& role) {
  const std::string step = role.parent_path().filename().string();
  return formats::verl::is_step_name(step) ? step : role.filename().string();
}

// The layers with a router (MoE layers), for inspect's expert count.
int64_t moe_layers(const catalog::Catalog& model) {
  return std::count_if(model.tensors.begin(), model.tensors.end(),
                       [](const catalog::LogicalTensor& t) { return t.name.ends_with("mlp.router.weight"); });
}

// The tags of `root`: Megatron's own save dir, a NeMo-RL step dir (its policy/weights/ save dir), a
// NeMo 2 checkpoint folder (its weights/), a NeMo 2 checkpoints dir (a tag per checkpoint folder) or a
// NeMo-RL checkpoint dir (a tag per step_N/: the iteration its weights' tracker names).
formats::SaveDir<TagSource> tags_of(const io::Source& source, const fs::path& root) {
  formats::SaveDir<TagSource> dir(
      "megatron", root,
      "no Megatron-LM iteration dir (iter_NNNNNNN/ or release/ with mp_rank_* dirs or "
      "torch_dist files)");
  dir.side_files = side_files_of(source, root);
  // verl's dist_ckpt/ given alone is its role dir
  const fs::path verl_role = verl_model_config_of(source, root) ? root.parent_path() : root;
  if (is_verl_megatron_role(source, verl_role)) {
    dir.tags.emplace_back(verl_tag_name(verl_role), verl_step(source, {verl_role}));
    dir.side_files.clear();  // the tag's own
  } else if (const auto roles = verl_megatron_roles(source, root); !roles.empty()) {
    dir.tags.emplace_back(root.filename().string(), verl_step(source, roles));
    dir.side_files.clear();
  } else if (const auto steps = verl_megatron_steps(source, root); !steps.empty()) {
    for (const auto& step : steps)
      dir.tags.emplace_back(step.filename().string(), verl_step(source, verl_megatron_roles(source, step)));
    dir.tracked = formats::verl::tracked_step(source, root);
  } else if (is_megatron_save(source, root)) {
    add_iterations(source, dir, root, {});
    if (is_iteration_dir(source, root) && !source.exists(root / kTracker))
      dir.side_files.clear();  // the tag's own
  } else if (is_megatron_save(source, nemo_rl_weights(root))) {
    add_iterations(source, dir, nemo_rl_weights(root), nemo_rl_step(source, root));
  } else if (is_nemo2_checkpoint(source, root)) {
    dir.tags.emplace_back(root.filename().string(), nemo2_checkpoint(source, root));
    dir.side_files.clear();  // the tag's own
  } else if (const auto checkpoints = nemo2_checkpoints(source, root); !checkpoints.empty()) {
    for (const auto& c : checkpoints)
      dir.tags.emplace_back(c.filename().string(), nemo2_checkpoint(source, c));
    // no tracker: a folder is whole once rank 0 has dumped its context (after the weights)
    dir.complete = [&](const std::string&, const TagSource& where) {
      return nemo2_model_yaml_of_weights(source, where.iteration).has_value();
    };
  } else {
    for (const auto& step :
         nemo_rl_steps(source, root, [&](const fs::path& d) { return is_megatron_save(source, d); })) {
      TagSource where = nemo_rl_step(source, step);
      where.iteration = latest_iteration(source, nemo_rl_weights(step));
      dir.tags.emplace_back(step.filename().string(), std::move(where));
    }
    dir.complete = [](const std::string&, const TagSource&) { return true; };  // step_N/ is renamed complete
  }
  return dir;
}

}  // namespace

bool is_megatron_source(const io::Source& source, const fs::path& root) {
  return is_megatron_save(source, root) || is_verl_megatron_role(source, root) ||
         !verl_megatron_roles(source, root).empty() || !verl_megatron_steps(source, root).empty() ||
         is_megatron_save(source, nemo_rl_weights(root)) || is_nemo2_checkpoint(source, root) ||
         !nemo2_checkpoints(source, root).empty() ||
         !nemo_rl_steps(source, root, [&](const fs::path& d) { return is_megatron_save(source, d); }).empty();
}

Checkpoint open(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  formats::SaveDir<TagSource> dir = tags_of(source, root);
  const std::vector<fs::path> root_side_files = dir.side_files;
  return formats::open_save_dir(
      source, std::move(dir), options,
      [&](io::FileSet& files, const std::string& name, const TagSource& where) {
        Iteration it = read_iteration(files, where.iteration, name);
        if (!where.stack.empty())
          it.tag.format = fmt::format("{} ({}: {})", where.stack, where.weights, it.tag.format);
        it.tag.side_files = side_files_of(source, where.iteration);
        it.tag.side_files.insert(it.tag.side_files.end(), where.stack_files.begin(), where.stack_files.end());
        // the HF tokenizer: Megatron-Bridge's iter_N/tokenizer/, or the stack's (NeMo-RL's policy/tokenizer/,
        // NeMo 2's context/nemo_tokenizer/)
        std::vector<fs::path> tokenizer;
        for (const fs::path& d : {where.tokenizer.value_or(fs::path()), where.iteration / "tokenizer"})
          if (!d.empty() && source.is_directory(d)) {
            const auto found = formats::side_files(source, d, [](const std::string&) { return false; });
            tokenizer.insert(tokenizer.end(), found.begin(), found.end());
          }
        add_hf_view(it.tag, it.args, {root_side_files, it.tag.side_files, tokenizer}, where.hf_config,
                    options.transpose_cache);
        it.tag.notes.insert(it.tag.notes.end(), where.notes.begin(), where.notes.end());
        for (const auto& t : it.tag.catalog(ViewRole::model)->tensors)
          if (dtype_is_floating(t.dtype)) {
            it.tag.topology.train_dtype = t.dtype;
            break;
          }
        it.tag.topology.tp = it.args.tp;
        it.tag.topology.pp = it.args.pp;
        it.tag.topology.dp = it.args.dp;
        it.tag.topology.ep = it.args.ep;
        it.tag.topology.experts =
            static_cast<int>(it.args.num_experts * moe_layers(*it.tag.catalog(ViewRole::model)));
        return std::move(it.tag);
      });
}

}  // namespace ckptfs::megatron
