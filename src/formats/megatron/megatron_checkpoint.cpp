// Megatron save dirs: a tag per iteration dir, the tracker file's iteration served at the root.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <regex>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/megatron.hpp"
#include "formats/megatron/hf_model.hpp"
#include "formats/megatron/iteration.hpp"
#include "formats/natural_order.hpp"
#include "formats/save_dir.hpp"
#include "formats/tag_selection.hpp"

namespace ckptfs::megatron {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";

bool is_iteration_name(const std::string& name) {
  static const std::regex kIter(R"(iter_\d{7,})");
  return name == "release" || std::regex_match(name, kIter);
}

bool is_iteration_dir(const fs::path& dir) { return is_legacy_iteration(dir) || is_torch_dist_iteration(dir); }

std::vector<fs::path> iteration_dirs(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory(ec) && is_iteration_name(entry.path().filename().string()) && is_iteration_dir(entry.path()))
      out.push_back(entry.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return natural_less(a.filename().string(), b.filename().string());
  });
  return out;
}

// The iteration dir name the tracker names: "release", or iter_%07d of its integer.
std::optional<std::string> tracked_iteration(const fs::path& root) {
  const auto tracked = formats::read_tracker(root / kTracker);
  if (!tracked) return std::nullopt;
  std::string text = *tracked;
  if (text == "release") return text;
  // A digit scan, not std::regex: its recursion per character overflows the stack on a long tracker.
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  if (text.empty() || !std::all_of(text.begin(), text.end(), is_digit))
    throw FormatError(fmt::format("{}: holds '{}', expected an iteration number or 'release'",
                                  (root / kTracker).string(), text.substr(0, 40)));
  // Megatron formats int(text) with %07d: digits as they are, leading zeros dropped, padded to 7 (no integer
  // conversion, so an absurdly long number names a dir that is missing rather than overflowing).
  text.erase(0, std::min(text.find_first_not_of('0'), text.size() - 1));
  return "iter_" + std::string(text.size() < 7 ? 7 - text.size() : 0, '0') + text;
}

// Regular files that are not checkpoint data, sorted (tokenizer files, configs beside the checkpoint).
std::vector<fs::path> side_files_of(const fs::path& dir) {
  static const std::set<std::string> kData = {kTracker, "metadata.json", "common.pt", ".metadata"};
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(ec) && !kData.contains(name) && !name.ends_with(".distcp")) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Iteration read_iteration(io::FileSet& files, const fs::path& dir, const std::string& name) {
  return is_legacy_iteration(dir) ? read_legacy_iteration(files, dir, name) : read_torch_dist_iteration(files, dir, name);
}

}  // namespace

bool is_megatron_source(const fs::path& source) {
  if (is_iteration_dir(source) || !iteration_dirs(source).empty()) return true;
  // a tracker beside iteration dirs that hold no checkpoint: Megatron's, to say what is missing (verl
  // writes a tracker of the same name beside global_step_N dirs)
  std::error_code ec;
  if (!fs::is_regular_file(source / kTracker, ec)) return false;
  for (const auto& entry : fs::directory_iterator(source, ec))
    if (entry.is_directory(ec) && is_iteration_name(entry.path().filename().string())) return true;
  return false;
}

Checkpoint open(const fs::path& source, const OpenOptions& options) {
  Checkpoint cp;
  cp.framework = "megatron";
  cp.root = source;
  std::vector<std::pair<std::string, fs::path>> tags;
  if (is_iteration_dir(source) && !fs::exists(source / kTracker)) {
    tags.emplace_back(source.filename().string(), source);
  } else {
    for (const auto& d : iteration_dirs(source)) tags.emplace_back(d.filename().string(), d);
    cp.side_files = side_files_of(source);
  }
  if (tags.empty())
    throw SourceError(fmt::format("{}: no Megatron-LM iteration dir (iter_NNNNNNN/ or release/ with mp_rank_* dirs "
                                  "or torch_dist files)",
                                  source.string()));
  cp.latest = tags.back().first;
  formats::follow_tracker(tags, tracked_iteration(source), source / kTracker, "iteration dir", cp.latest);
  if (options.tag) formats::keep_only_tag(tags, *options.tag, source, cp.latest);
  io::FileSet files;
  formats::read_tags(cp, tags, options, [&](const auto& t) {
    const auto& [name, dir] = t;
    Iteration it = read_iteration(files, dir, name);
    it.tag.side_files = side_files_of(dir);
    add_hf_view(it.tag, it.args, {cp.side_files, it.tag.side_files});
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
  return cp;
}

}  // namespace ckptfs::megatron
