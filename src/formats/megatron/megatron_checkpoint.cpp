// Megatron save dirs: a tag per iteration dir, the tracker file's iteration served at the root.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/megatron.hpp"
#include "formats/megatron/hf_model.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";

bool is_iteration_name(const std::string& name) {
  return name == "release" || (name.starts_with("iter_") && name.size() >= 12 &&
                               formats::is_decimal(std::string_view(name).substr(5)));
}

bool is_iteration_dir(const fs::path& dir) { return is_legacy_iteration(dir) || is_torch_dist_iteration(dir); }

std::vector<fs::path> iteration_dirs(const fs::path& root) {
  return formats::sorted_subdirs(root, [](const fs::path& d) {
    return is_iteration_name(d.filename().string()) && is_iteration_dir(d);
  });
}

// The iteration dir name the tracker names: "release", or iter_%07d of its integer.
std::optional<std::string> tracked_iteration(const fs::path& root) {
  const auto tracked = formats::read_tracker(root / kTracker);
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
std::vector<fs::path> side_files_of(const fs::path& dir) {
  return formats::side_files(dir, [](const std::string& name) {
    return name == kTracker || name == "metadata.json" || name == "common.pt" || name == ".metadata" ||
           name.ends_with(".distcp");
  });
}

Iteration read_iteration(io::FileSet& files, const fs::path& dir, const std::string& name) {
  return is_legacy_iteration(dir) ? read_legacy_iteration(files, dir, name) : read_torch_dist_iteration(files, dir, name);
}

}  // namespace

bool is_megatron_source(const fs::path& source) {
  if (is_iteration_dir(source) || !iteration_dirs(source).empty()) return true;
  // a tracker beside iteration dirs that hold no checkpoint: Megatron's, to say what is missing (verl
  // writes a tracker of the same name beside global_step_N dirs)
  if (!io::is_file(source / kTracker)) return false;
  for (const auto& entry : io::list_directory(source))
    if (entry.is_directory && is_iteration_name(entry.path.filename().string())) return true;
  return false;
}

Checkpoint open(const fs::path& source, const OpenOptions& options) {
  formats::SaveDir<fs::path> dir("megatron", source,
                                 "no Megatron-LM iteration dir (iter_NNNNNNN/ or release/ with mp_rank_* dirs or "
                                 "torch_dist files)");
  if (is_iteration_dir(source) && !io::exists(source / kTracker)) {
    dir.tags.emplace_back(source.filename().string(), source);
  } else {
    for (const auto& d : iteration_dirs(source)) dir.tags.emplace_back(d.filename().string(), d);
    // the tracker is read only beside iteration dirs: without any, the error says they are missing
    if (auto tracked = dir.tags.empty() ? std::nullopt : tracked_iteration(source)) dir.tracked = formats::Tracked{source / kTracker, *tracked, "iteration dir"};
    dir.side_files = side_files_of(source);
  }
  const std::vector<fs::path> root_side_files = dir.side_files;
  return formats::open_save_dir(std::move(dir), options, [&](io::FileSet& files, const std::string& name,
                                                            const fs::path& tag_dir) {
    Iteration it = read_iteration(files, tag_dir, name);
    it.tag.side_files = side_files_of(tag_dir);
    // Megatron-Bridge keeps the HF tokenizer in the iteration's tokenizer/ folder
    const fs::path tokenizer = tag_dir / "tokenizer";
    std::vector<fs::path> bridge_tokenizer;
    if (io::is_directory(tokenizer)) bridge_tokenizer = formats::side_files(tokenizer, [](const std::string&) { return false; });
    add_hf_view(it.tag, it.args, {root_side_files, it.tag.side_files, bridge_tokenizer});
    for (const auto& t : it.tag.catalog(ViewRole::model)->tensors)
      if (dtype_is_floating(t.dtype)) {
        it.tag.topology.train_dtype = t.dtype;
        break;
      }
    it.tag.topology.tp = it.args.tp;
    it.tag.topology.pp = it.args.pp;
    it.tag.topology.dp = it.args.dp;
    return std::move(it.tag);
  });
}

}  // namespace ckptfs::megatron
