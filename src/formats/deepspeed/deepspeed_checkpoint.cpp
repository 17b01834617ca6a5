// A DeepSpeed save dir: `latest` names the tag served at the root; every tag dir is indexed.
#include "ckptfs/deepspeed.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/deepspeed/tag_files.hpp"
#include "formats/deepspeed/universal_input.hpp"
#include "formats/natural_order.hpp"
#include "formats/save_dir.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> tag_dirs(const io::Source& source, const fs::path& root) {
  return formats::sorted_subdirs(source, root, [&](const fs::path& d) { return is_tag_dir(source, d); });
}

// The tag a `latest` (or, in a save dir of universal checkpoints only, `latest_universal`) file names.
std::optional<formats::Tracked> tracked_tag(const io::Source& source, const fs::path& root) {
  for (const char* name : {"latest", "latest_universal"})
    if (auto tag = formats::read_tracker(source, root / name); tag && !tag->empty())
      return formats::Tracked{root / name, *tag, "tag"};
  return std::nullopt;
}

}  // namespace

bool is_deepspeed_source(const io::Source& source, const fs::path& root) {
  return is_tag_dir(source, root) || source.is_file(root / "latest") || !tag_dirs(source, root).empty();
}

Checkpoint open(const io::Source& source, const fs::path& root, const OpenOptions& options) {
  formats::SaveDir<fs::path> dir("deepspeed", root, "no DeepSpeed tag directory found");
  const bool is_tag = is_tag_dir(source, root);  // SRC is one tag dir
  if (is_tag) {
    dir.tags.emplace_back(root.filename().string(), root);
  } else {
    for (const auto& d : tag_dirs(source, root)) dir.tags.emplace_back(d.filename().string(), d);
    dir.tracked = tracked_tag(source, root);
    // `latest` is written once a save is complete, `latest_universal` once ds_to_universal has converted
    // one: a tag, or a universal dir, of its tracker's series after the one it names is being written.
    // Without the tracker (save_latest=False) a tag is taken as complete.
    dir.complete = [&source, latest = formats::read_tracker(source, root / "latest"),
                    latest_universal = formats::read_tracker(source, root / "latest_universal")](
                       const std::string& name, const fs::path& tag_dir) {
      const auto& tracker = is_universal_dir(source, tag_dir) ? latest_universal : latest;
      return !tracker || tracker->empty() || tracker_reached(*tracker, name);
    };
  }
  dir.side_files = formats::side_files(source, root, [&](const std::string& name) {
    return name == "latest" || name == "latest_universal" ||
           (is_tag && (name.ends_with("_model_states.pt") || name.ends_with("optim_states.pt")));
  });
  return formats::open_save_dir(source, std::move(dir), options,
                                [](io::FileSet& files, const std::string& name, const fs::path& tag_dir) {
                                  return read_tag(files, tag_dir, name);
                                });
}

}  // namespace ckptfs::deepspeed
