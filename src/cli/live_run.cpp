#include "cli/live_run.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

namespace ckptfs::cli {

namespace fs = std::filesystem;

namespace {

std::set<std::string> tag_names(const Checkpoint& cp) {
  std::set<std::string> out;
  for (const auto& t : cp.tags) out.insert(t.name);
  return out;
}

std::set<std::string> left_out_names(const Checkpoint& cp) {
  std::set<std::string> out;
  for (const auto& l : cp.left_out) out.insert(l.name);
  return out;
}

template <typename Paths>
std::vector<std::pair<fs::path, std::optional<io::PathState>>> states_of(const io::Source& source,
                                                                         const Paths& paths) {
  std::vector<std::pair<fs::path, std::optional<io::PathState>>> out;
  for (const auto& p : paths) out.emplace_back(p, source.path_state(p));
  return out;
}

bool unchanged(const io::Source& source,
               const std::vector<std::pair<fs::path, std::optional<io::PathState>>>& states) {
  for (const auto& [path, state] : states)
    if (source.path_state(path) != state) return false;
  return true;
}

}  // namespace

LiveRun::LiveRun(Options options, const Checkpoint& first)
    : options_(std::move(options)), watch_(*options_.source, options_.refresh), current_(first) {
  remember(current_);
}

void LiveRun::remember(const Checkpoint& checkpoint) {
  std::map<std::string, Snapshot, std::less<>> kept;
  for (const auto& tag : checkpoint.tags) {
    if (auto it = snapshots_.find(tag.name); it != snapshots_.end()) {
      kept.emplace(tag.name, std::move(it->second));
      continue;
    }
    std::vector<fs::path> paths = {tag.dir};
    paths.insert(paths.end(), tag.files.begin(), tag.files.end());
    paths.insert(paths.end(), tag.side_files.begin(), tag.side_files.end());
    kept.emplace(tag.name, states_of(*options_.source, paths));
  }
  snapshots_ = std::move(kept);
  side_files_ = states_of(*options_.source, checkpoint.side_files);
}

nlohmann::json LiveRun::description() const {
  const std::string how =
      watch_.polling_because().empty()
          ? "inotify"
          : fmt::format("a poll every {} s ({})", options_.refresh.count(), watch_.polling_because());
  nlohmann::json j = {{"following", true}, {"how", how}, {"refreshes", refreshes_}};
  j["last_changes"] = last_changes_;
  return j;
}

std::optional<Checkpoint> LiveRun::refresh(std::vector<std::string>& changes) {
  options_.source->relist();
  std::set<std::string> reread;  // tags known before whose files changed
  OpenOptions open = options_.open;
  open.known = [&](const std::string& name) -> const Tag* {
    const Tag* tag = current_.find(name);
    const auto snapshot = snapshots_.find(name);
    if (tag == nullptr || snapshot == snapshots_.end()) return nullptr;
    if (unchanged(*options_.source, snapshot->second)) return tag;
    reread.insert(name);
    snapshots_.erase(snapshot);
    return nullptr;
  };
  Checkpoint next = open_checkpoint(*options_.source, open);

  const auto before = tag_names(current_), after = tag_names(next);
  for (const auto& name : after)
    if (!before.contains(name)) changes.push_back(fmt::format("tag {} added", name));
  for (const auto& name : before)
    if (!after.contains(name)) changes.push_back(fmt::format("tag {} removed", name));
  for (const auto& name : reread)
    if (after.contains(name)) changes.push_back(fmt::format("tag {} read again (its files changed)", name));
  if (next.latest != current_.latest) changes.push_back(fmt::format("root now tag {}", next.latest));
  if (states_of(*options_.source, next.side_files) != side_files_) changes.push_back("side files changed");
  const auto left_out_before = left_out_names(current_);
  for (const auto& l : next.left_out)
    if (!left_out_before.contains(l.name))
      changes.push_back(fmt::format("tag {} left out: {}", l.name, l.error));
  if (next.in_progress != current_.in_progress && !next.in_progress.empty())
    changes.push_back(
        fmt::format("in progress (not served until complete): {}", fmt::join(next.in_progress, ", ")));
  if (changes.empty()) return std::nullopt;
  return next;
}

void LiveRun::follow(const fuse::ReplaceTree& replace, const std::function<void(const std::string&)>& log,
                     std::stop_token stop) {
  if (!watch_.polling_because().empty())
    log(fmt::format("following {}: {}", options_.source->root().string(),
                    description()["how"].get<std::string>()));
  std::string last_failure;
  while (watch_.wait(stop)) {
    try {
      std::vector<std::string> changes;
      auto next = refresh(changes);
      if (!next) continue;
      current_ = std::move(*next);
      remember(current_);
      ++refreshes_;
      last_changes_ = changes;
      vfs::TreeOptions tree = options_.tree;
      tree.live = description();
      replace(std::make_shared<const vfs::VirtualTree>(vfs::build_tree(*options_.source, current_, tree)));
      for (const auto& change : changes) log(fmt::format("{}: {}", options_.source->root().string(), change));
      if (!options_.index_key.empty())
        if (const std::string warning = index::save_index(
                {current_, false, options_.index_file, "", options_.index_key, options_.source});
            !warning.empty())
          log(warning);
      last_failure.clear();
    } catch (const std::exception& e) {
      // A save caught half-way that the adapter could not tell from a finished one, a tracker naming a tag
      // being deleted: the last tree stays served, and the next change tries again.
      if (e.what() != last_failure)
        log(fmt::format("{}: refresh failed, still serving the last complete state: {}",
                        options_.source->root().string(), e.what()));
      last_failure = e.what();
    }
  }
}

}  // namespace ckptfs::cli
