// What every framework's save dir shares, so that each adapter says only its format's facts: tags found
// as subdirs in natural order (global_step9 before global_step10), the tag a tracker file names served at
// the root (else the last), --tag keeping one tag, side files served beside the views, and each tag read
// with the root tag required valid (any other tag that fails is left out with its error, or with
// OpenOptions::strict refuses the whole source). Rank files inside a tag are read through
// formats/parallel_reads.hpp.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/io_tree.hpp"
#include "formats/natural_order.hpp"

namespace ckptfs::formats {

// The subdirs of `dir` that `keep` accepts, in natural order of their names.
std::vector<std::filesystem::path> sorted_subdirs(
    const io::Source& source, const std::filesystem::path& dir,
    const std::function<bool(const std::filesystem::path&)>& keep);

// The regular files of `dir` whose names `is_data` does not claim, sorted: served beside the views
// (tokenizer files, configs, trainer_state.json).
std::vector<std::filesystem::path> side_files(const io::Source& source, const std::filesystem::path& dir,
                                              const std::function<bool(const std::string& name)>& is_data);

// The text of a tracker file (DeepSpeed's `latest`, Megatron-LM's and verl's
// latest_checkpointed_iteration.txt) without surrounding white space; nullopt when there is no such file.
std::optional<std::string> read_tracker(const io::Source& source, const std::filesystem::path& file);

// True when `text` is one or more ASCII digits (a step or iteration number as trackers and dir names
// write it). A scan, not std::regex, whose recursion per character overflows the stack on long input.
bool is_decimal(std::string_view text);

// A tracker file and the tag it names: `what` the tag is in the framework's words ("iteration dir").
struct Tracked {
  std::filesystem::path file;
  std::string tag;
  std::string what = "tag";
};

// A save dir as an adapter found it: its tags (name, and what the adapter needs to read the tag), in
// natural order. A source that is one tag (a tag dir, a lone file) is a save dir of that one tag.
template <typename Where>
struct SaveDir {
  SaveDir(std::string framework, std::filesystem::path root, std::string none_found = "")
      : framework(std::move(framework)), root(std::move(root)), none_found(std::move(none_found)) {}

  std::string framework;
  std::filesystem::path root;
  std::vector<std::pair<std::string, Where>> tags;
  std::optional<Tracked> tracked;                 // the root tag, when a tracker names one; else the last tag
  std::vector<std::filesystem::path> side_files;  // of the root
  std::string none_found;                         // "no DeepSpeed tag directory found": the error when no tag
  // The adapter's own mark of a complete save (HF Trainer's trainer_state.json, DeepSpeed's two trackers),
  // in place of the tracker's; null: a tag is complete once `tracked` has reached it (tracker_reached).
  std::function<bool(const std::string& name, const Where& where)> complete;
};

namespace detail {

template <typename Where>
bool has_tag(const SaveDir<Where>& dir, const std::string& name) {
  return std::any_of(dir.tags.begin(), dir.tags.end(), [&](const auto& t) { return t.first == name; });
}

// A live mount serves a tag it does not know yet only once complete: the adapter's own mark where it has
// one, else the tracker's (a save dir with a tracker writes it after the tag: DeepSpeed's `latest`,
// Megatron's and verl's trackers, so a tag of its series after the one it names is still being written).
template <typename Where>
bool is_complete(const SaveDir<Where>& dir, size_t index) {
  if (dir.complete) return dir.complete(dir.tags[index].first, dir.tags[index].second);
  return !dir.tracked || tracker_reached(dir.tracked->tag, dir.tags[index].first);
}

template <typename Where>
std::vector<std::string> tag_names(const SaveDir<Where>& dir) {
  std::vector<std::string> out;
  for (const auto& t : dir.tags) out.push_back(t.first);
  return out;
}

}  // namespace detail

// The checkpoint of `dir`, read from `source`: read(files, name, where) makes the Tag of each tag kept (--tag
// keeps one). Throws SourceError when there is no tag or none of the --tag name, FormatError when the tracker
// names a tag that is not there.
template <typename Where, typename Read>
Checkpoint open_save_dir(const io::Source& source, SaveDir<Where> dir, const OpenOptions& options,
                         Read read) {
  if (dir.tags.empty()) throw SourceError(fmt::format("{}: {}", dir.root.string(), dir.none_found));
  Checkpoint cp;
  cp.framework = std::move(dir.framework);
  cp.root = dir.root;
  cp.side_files = std::move(dir.side_files);
  cp.latest = dir.tags.back().first;
  if (dir.tracked) {
    if (!detail::has_tag(dir, dir.tracked->tag))
      throw FormatError(fmt::format("{}: names {} {}, which is missing or holds no checkpoint",
                                    dir.tracked->file.string(), dir.tracked->what, dir.tracked->tag));
    cp.latest = dir.tracked->tag;
  }
  if (options.tag) {
    if (!detail::has_tag(dir, *options.tag))
      throw SourceError(fmt::format("{}: no tag '{}' (tags: {})", dir.root.string(), *options.tag,
                                    fmt::join(detail::tag_names(dir), ", ")));
    std::erase_if(dir.tags, [&](const auto& t) { return t.first != *options.tag; });
    cp.latest = *options.tag;
  }
  io::FileSet files(source);
  for (size_t i = 0; i < dir.tags.size(); ++i) {
    const auto& [name, where] = dir.tags[i];
    if (options.known) {
      if (const Tag* kept = options.known(name)) {
        cp.tags.push_back(*kept);
        continue;
      }
      if (!detail::is_complete(dir, i)) {
        cp.in_progress.push_back(name);
        continue;
      }
    }
    try {
      cp.tags.push_back(read(files, name, where));
    } catch (const Error& e) {
      if (options.strict || name == cp.latest) throw;
      cp.left_out.push_back({name, e.what()});
    }
  }
  // Without a tracker the root is the last tag: the last complete one while a later save is in progress.
  if (!dir.tracked && !options.tag && !cp.in_progress.empty() && cp.find(cp.latest) == nullptr) {
    if (cp.tags.empty())
      throw SourceError(fmt::format("{}: no complete save yet (in progress: {})", dir.root.string(),
                                    fmt::join(cp.in_progress, ", ")));
    cp.latest = cp.tags.back().name;
  }
  return cp;
}

}  // namespace ckptfs::formats
