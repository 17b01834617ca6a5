// DCP layouts: a DCP dir is one tag; a folder holding DCP dirs (accelerate) is one tag with a full state
// per dir; a folder of step dirs has a tag per step, the highest number served at the root.
#include <fmt/format.h>

#include <algorithm>
#include <regex>

#include "ckptfs/dcp.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/dcp/dcp_metadata.hpp"
#include "formats/dcp/dcp_tag.hpp"
#include "formats/dcp/hf_storage.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::dcp {

namespace fs = std::filesystem;

namespace {

bool is_dcp_dir(const io::Source& source, const fs::path& dir) {
  return !metadata_files(source, dir).empty();
}

std::vector<fs::path> subdirs(const io::Source& source, const fs::path& dir) {
  return formats::sorted_subdirs(source, dir, [](const fs::path&) { return true; });
}

// A step dir of a training run: torchtitan's step-N, HF Trainer's checkpoint-N, accelerate's
// checkpoint_N (Megatron-style iter_N too). Accelerate's DCP dirs (pytorch_model_fsdp_0, optimizer_0)
// are not steps.
bool is_step_name(const std::string& name) {
  static const std::regex kStep(R"((step|checkpoint|iter|global_step)[-_]?\d+)");
  return std::regex_match(name, kStep);
}

// The DCP dirs a checkpoint folder stands for: itself, or its subdirs that are DCP dirs and not steps.
std::vector<fs::path> dcp_dirs_of(const io::Source& source, const fs::path& dir) {
  if (is_dcp_dir(source, dir)) return {dir};
  std::vector<fs::path> out;
  for (const auto& d : subdirs(source, dir))
    if (is_dcp_dir(source, d) && !is_step_name(d.filename().string())) out.push_back(d);
  return out;
}

// A step dir saved by HuggingFaceStorageWriter (torchtitan's last step in HF format, beside DCP steps).
bool is_hf_step_dir(const io::Source& source, const fs::path& dir) {
  return is_step_name(dir.filename().string()) && is_hf_storage_dir(source, dir);
}

// Regular files of `dir` (not DCP data): served beside the views.
std::vector<fs::path> side_files_of(const io::Source& source, const fs::path& dir) {
  return formats::side_files(source, dir, [](const std::string& name) {
    return name == ".metadata" || is_rank_metadata_name(name) || name.ends_with(".distcp");
  });
}

// A step dir whose DCP data is being written: .distcp files in it (or in its DCP dirs, one level down), no
// .metadata yet (DCP writes it last).
bool is_step_being_saved(const io::Source& source, const fs::path& dir) {
  if (!is_step_name(dir.filename().string())) return false;
  const auto holds_data = [&](const fs::path& d) {
    const auto entries = source.list_directory(d);
    return std::any_of(entries.begin(), entries.end(), [](const io::DirectoryEntry& e) {
      return e.is_file && e.path.extension() == ".distcp";
    });
  };
  if (holds_data(dir)) return true;
  for (const auto& d : subdirs(source, dir))
    if (holds_data(d)) return true;
  return false;
}

// A tag: the dir it is named after and its DCP dirs (none: a Hugging Face storage step dir); `saving`: a step
// dir being written (is_step_being_saved), which a live mount lists as in progress.
struct TagDirs {
  fs::path dir;
  std::vector<fs::path> dcp_dirs;
  bool saving = false;
};

}  // namespace

bool is_dcp_source(const io::Source& source, const fs::path& root) {
  if (!dcp_dirs_of(source, root).empty()) return true;
  for (const auto& d : subdirs(source, root))
    if (!dcp_dirs_of(source, d).empty() || is_hf_step_dir(source, d)) return true;
  return false;
}

// `root` is resolved (open_checkpoint): its filename is the dir's own name, never empty.
Checkpoint open(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  // step dirs sort naturally: the highest step is the last, served at the root
  formats::SaveDir<TagDirs> save_dir("dcp", root, "no DCP checkpoint (.metadata or __<rank>.metadata) found");
  if (auto dirs = dcp_dirs_of(source, root); !dirs.empty()) {
    save_dir.tags.emplace_back(root.filename().string(), TagDirs{root, std::move(dirs)});
  } else {
    for (const auto& d : subdirs(source, root)) {
      auto dirs = dcp_dirs_of(source, d);
      if (!dirs.empty() || is_hf_step_dir(source, d)) {
        save_dir.tags.emplace_back(d.filename().string(), TagDirs{d, std::move(dirs)});
      } else if (options.known &&
                 is_step_being_saved(source, d)) {  // only a live mount says what is in progress
        save_dir.tags.emplace_back(d.filename().string(), TagDirs{d, {}, true});
      }
    }
    save_dir.side_files = side_files_of(source, root);
    // DCP writes .metadata last; HF Trainer writes trainer_state.json into checkpoint-N/ after the model and
    // the optimizer: a live mount serves a new checkpoint-N once it is there.
    save_dir.complete = [&](const std::string& name, const TagDirs& t) {
      static const std::regex kTrainerStep(R"(checkpoint-\d+)");
      return !t.saving &&
             (!std::regex_match(name, kTrainerStep) || source.exists(t.dir / "trainer_state.json"));
    };
  }
  return formats::open_save_dir(source, std::move(save_dir), options,
                                [&](io::FileSet& files, const std::string& name, const TagDirs& t) {
                                  if (t.dcp_dirs.empty()) return read_hf_storage_tag(files, t.dir, name);
                                  Tag tag = read_tag(files, t.dir, name, t.dcp_dirs);
                                  tag.side_files = side_files_of(source, t.dir);
                                  return tag;
                                });
}

}  // namespace ckptfs::dcp
