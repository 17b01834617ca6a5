// The mount layout of a checkpoint (docs/mount.md).
#include <fmt/format.h>
#include <unistd.h>

#include <set>

#include "ckptfs/describe.hpp"
#include "ckptfs/layout.hpp"
#include "ckptfs/live_stats.hpp"
#include "ckptfs/version.hpp"
#include "ckptfs/vfs.hpp"
#include "vfs/source_access.hpp"

namespace ckptfs::vfs {

namespace {

constexpr std::string_view kRenamedDir = "source";  // side files whose name a view or ckptfs itself uses

}  // namespace

VirtualTree build_tree(const io::Source& source, const Checkpoint& checkpoint, const TreeOptions& options) {
  const ShardOptions& shards = options.shards;
  // What has no POSIX modes (an object store's) is the mounting user's, as s3fs and mountpoint-s3 show it.
  SourceAccess access(checkpoint.root, source.is_remote(), {::geteuid(), ::getegid(), 0555});
  TreeBuilder builder(access.directory(checkpoint.root));
  builder.set_directory_access(ckptfs::views::kTagsDir, access.directory(checkpoint.root));
  std::vector<std::vector<ViewFile>> views;  // per tag; the root shares the latest tag's files
  for (const auto& tag : checkpoint.tags) views.push_back(tag_views(source, tag, true, shards, options.gguf));
  const Tag& latest = checkpoint.latest_tag();
  const auto& root_views = views[&latest - checkpoint.tags.data()];
  size_t entries = root_views.size();
  for (const auto& v : views) entries += v.size();
  builder.reserve(entries * 2);  // files and the dirs above them, roughly: no rehash of a million entries
  // The root views and tags/<latest>/ are the same inodes (hard links): one page-cache copy.
  std::vector<Ino> root_inodes;
  for (const auto& v : root_views) {
    root_inodes.push_back(builder.add_file(v.path, v.file, access.file(v.file->sources())));
    // A view's directory at the root (fp32/, universal/) stands for the latest tag's.
    if (const size_t slash = v.path.find('/'); slash != std::string::npos)
      builder.set_directory_access(std::string_view(v.path).substr(0, slash), access.directory(latest.dir));
  }
  for (size_t i = 0; i < views.size(); ++i) {
    const bool is_root = &views[i] == &root_views;
    const std::string tag_dir = fmt::format("{}/{}", ckptfs::views::kTagsDir, checkpoint.tags[i].name);
    builder.set_directory_access(tag_dir, access.directory(checkpoint.tags[i].dir));
    for (size_t j = 0; j < views[i].size(); ++j) {
      const std::string path = fmt::format("{}/{}", tag_dir, views[i][j].path);
      if (is_root) {
        builder.add_link(path, root_inodes[j]);
      } else {
        builder.add_file(path, views[i][j].file, access.file(views[i][j].file->sources()));
      }
    }
  }

  // Names at the root that ckptfs owns; a side file with one of them moves to source/<name>.
  std::set<std::string, std::less<>> taken(ckptfs::views::kRootNames.begin(),
                                           ckptfs::views::kRootNames.end());
  for (const auto& v : root_views) taken.insert(v.path.substr(0, v.path.find('/')));
  std::vector<std::pair<std::string, io::FilePtr>> side_files;
  bool any_renamed = false;
  for (const auto& path : checkpoint.side_files) {
    std::string name = path.filename().string();
    any_renamed = any_renamed || taken.contains(name);
    side_files.emplace_back(std::move(name), source.open(path));
  }
  if (any_renamed) taken.insert(std::string(kRenamedDir));
  nlohmann::json renamed = nlohmann::json::object();
  for (const auto& v : root_views)  // the root tag's own side files that yielded to its views (tag_views)
    if (v.path.starts_with(kRenamedDir) && v.path.size() > kRenamedDir.size() &&
        v.path[kRenamedDir.size()] == '/')
      renamed[v.path.substr(kRenamedDir.size() + 1)] = v.path;
  for (const auto& [name, file] : side_files) {
    std::string mount_path = name;
    if (taken.contains(name)) renamed[name] = mount_path = fmt::format("{}/{}", kRenamedDir, name);
    builder.add_file(mount_path, views::make_passthrough(file), access.file({file}));
  }

  nlohmann::json info = describe_checkpoint(checkpoint, false, views,
                                            gguf_refusals(source, checkpoint, views, shards, options.gguf));
  info["root_tag"] = latest.name;
  info["renamed_side_files"] = std::move(renamed);
  if (!options.live.is_null()) info["live"] = options.live;
  // Which ckptfs made these files (a view's bytes can change between versions: say which one served them).
  const std::string_view revision = version::git_revision();
  info["ckptfs"] = {{"version", version::project_version()},
                    {"git_revision", revision.empty() ? nlohmann::json() : nlohmann::json(revision)}};
  builder.add_file(ckptfs::views::kInfoFile, views::make_bytes_file(info.dump(2) + "\n"));
  if (options.stats)
    builder.add_file(ckptfs::views::kStatsFile, views::make_live_file([stats = options.stats] {
                       return stats->snapshot().dump(2) + "\n";
                     }));
  return std::move(builder).build();
}

}  // namespace ckptfs::vfs
