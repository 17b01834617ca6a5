// DCP layouts: a DCP dir is one tag; a folder holding DCP dirs (accelerate) is one tag with a full state
// per dir; a folder of step dirs has a tag per step, the highest number served at the root.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <regex>

#include "ckptfs/dcp.hpp"
#include "ckptfs/error.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "formats/dcp/dcp_tag.hpp"
#include "formats/dcp/hf_storage.hpp"
#include "formats/natural_order.hpp"
#include "formats/save_dir.hpp"
#include "formats/tag_names.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;

namespace {

bool is_dcp_dir(const fs::path& dir) {
  return !metadata_files(dir).empty();
}

std::vector<fs::path> subdirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory(ec)) out.push_back(entry.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return natural_less(a.filename().string(), b.filename().string());
  });
  return out;
}

// A step dir of a training run: torchtitan's step-N, HF Trainer's checkpoint-N, accelerate's
// checkpoint_N (Megatron-style iter_N too). Accelerate's DCP dirs (pytorch_model_fsdp_0, optimizer_0)
// are not steps.
bool is_step_name(const std::string& name) {
  static const std::regex kStep(R"((step|checkpoint|iter|global_step)[-_]?\d+)");
  return std::regex_match(name, kStep);
}

// The DCP dirs a checkpoint folder stands for: itself, or its subdirs that are DCP dirs and not steps.
std::vector<fs::path> dcp_dirs_of(const fs::path& dir) {
  if (is_dcp_dir(dir)) return {dir};
  std::vector<fs::path> out;
  for (const auto& d : subdirs(dir))
    if (is_dcp_dir(d) && !is_step_name(d.filename().string())) out.push_back(d);
  return out;
}

// A step dir saved by HuggingFaceStorageWriter (torchtitan's last step in HF format, beside DCP steps).
bool is_hf_step_dir(const fs::path& dir) {
  return is_step_name(dir.filename().string()) && is_hf_storage_dir(dir);
}

// Regular files of `dir` (not DCP data), sorted: served beside the views.
std::vector<fs::path> side_files_of(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || name == ".metadata" || is_rank_metadata_name(name) || name.ends_with(".distcp"))
      continue;
    out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool is_dcp_source(const fs::path& source) {
  if (!dcp_dirs_of(source).empty()) return true;
  for (const auto& d : subdirs(source))
    if (!dcp_dirs_of(d).empty() || is_hf_step_dir(d)) return true;
  return false;
}

// `source` is resolved (open_checkpoint): its filename is the dir's own name, never empty.
Checkpoint open(const fs::path& source, const OpenOptions& options) {
  Checkpoint cp;
  cp.framework = "dcp";
  cp.root = source;
  std::vector<std::pair<std::string, std::vector<fs::path>>> tags;  // name -> its DCP dirs
  std::vector<fs::path> tag_dirs;
  if (auto dirs = dcp_dirs_of(source); !dirs.empty()) {
    tags.emplace_back(source.filename().string(), std::move(dirs));
    tag_dirs.push_back(source);
  } else {
    for (const auto& d : subdirs(source)) {
      auto dirs = dcp_dirs_of(d);
      if (dirs.empty() && !is_hf_step_dir(d)) continue;
      tags.emplace_back(d.filename().string(), std::move(dirs));  // no DCP dirs: an HF storage step
      tag_dirs.push_back(d);
    }
    cp.side_files = side_files_of(source);
  }
  if (tags.empty()) throw SourceError(fmt::format("{}: no DCP checkpoint (.metadata or __<rank>.metadata) found", source.string()));
  cp.latest = tags.back().first;  // step dirs sort naturally: the highest step is the last
  if (options.tag) {
    auto it = std::find_if(tags.begin(), tags.end(), [&](const auto& t) { return t.first == *options.tag; });
    if (it == tags.end())
      throw SourceError(fmt::format("{}: no tag '{}' (tags: {})", source.string(), *options.tag,
                                    fmt::join(formats::tag_names(tags), ", ")));
    tag_dirs = {tag_dirs[it - tags.begin()]};
    tags = {*it};
    cp.latest = *options.tag;
  }
  io::FileSet files;
  formats::read_tags(cp, tags, options, [&](const auto& t) {
    const fs::path& dir = tag_dirs[&t - tags.data()];
    if (t.second.empty()) return read_hf_storage_tag(files, dir, t.first);  // no DCP dirs: an HF storage dir
    Tag tag = read_tag(files, dir, t.first, t.second);
    tag.side_files = side_files_of(dir);
    return tag;
  });
  return cp;
}

}  // namespace ckptfs::dcp
