// A DeepSpeed save dir: `latest` names the tag served at the root; every tag dir is indexed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "ckptfs/deepspeed.hpp"
#include "ckptfs/error.hpp"
#include "formats/deepspeed/tag_files.hpp"
#include "formats/natural_order.hpp"
#include "formats/save_dir.hpp"
#include "formats/tag_selection.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> list_tags(const fs::path& root) {
  std::vector<std::string> tags;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory(ec) && is_tag_dir(entry.path()))
      tags.push_back(entry.path().filename().string());
  std::sort(tags.begin(), tags.end(), natural_less);
  return tags;
}

// The tag a `latest` (or, in a save dir of universal checkpoints only, `latest_universal`) file names.
std::optional<std::string> read_latest(const fs::path& root, const char* file) {
  std::ifstream in(root / file);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string tag = ss.str();
  const auto first = tag.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return std::nullopt;
  return tag.substr(first, tag.find_last_not_of(" \t\r\n") - first + 1);
}

std::vector<fs::path> list_side_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  const bool tag_dir = is_tag_dir(dir);  // listed once, not once per entry
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || name == "latest" || name == "latest_universal") continue;
    if (tag_dir && (name.ends_with("_model_states.pt") || name.ends_with("optim_states.pt")))
      continue;
    out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool is_deepspeed_source(const fs::path& source) {
  std::error_code ec;
  return is_tag_dir(source) || fs::is_regular_file(source / "latest", ec) || !list_tags(source).empty();
}

Checkpoint open(const fs::path& source, const OpenOptions& options) {
  Checkpoint cp;
  cp.framework = "deepspeed";
  std::vector<std::pair<std::string, fs::path>> tag_dirs;
  if (is_tag_dir(source)) {
    // SRC is one tag dir.
    cp.root = source;
    tag_dirs.emplace_back(source.filename().string(), source);
    cp.latest = tag_dirs.front().first;
  } else {
    cp.root = source;
    for (const auto& t : list_tags(source)) tag_dirs.emplace_back(t, source / t);
    if (tag_dirs.empty())
      throw SourceError(fmt::format("{}: no DeepSpeed tag directory found", source.string()));
    auto latest = read_latest(source, "latest");
    if (!latest) latest = read_latest(source, "latest_universal");
    if (latest &&
        std::none_of(tag_dirs.begin(), tag_dirs.end(), [&](const auto& t) { return t.first == *latest; }))
      throw FormatError(fmt::format("{}: names tag '{}', which is not a checkpoint directory here",
                                    (source / "latest").string(), *latest));
    cp.latest = latest.value_or(tag_dirs.back().first);
  }
  if (options.tag) formats::keep_only_tag(tag_dirs, *options.tag, source, cp.latest);
  io::FileSet files;
  formats::read_tags(cp, tag_dirs, options, [&](const auto& t) { return read_tag(files, t.second, t.first); });
  cp.side_files = list_side_files(cp.root);
  return cp;
}

}  // namespace ckptfs::deepspeed
