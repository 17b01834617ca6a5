// `ckptfs cat SRC VIEW_PATH [--tag T] [-o FILE]`: one file of the tree a mount of SRC shows, streamed to
// stdout or FILE without FUSE (containers without /dev/fuse, pipelines: `| zstd`, `| aws s3 cp - ...`).
// The tree is the mount's own (vfs::build_tree), read as an open of the mount reads it (open_layout).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/vfs.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/source_argument.hpp"
#include "cli/view_output.hpp"

namespace ckptfs::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCatUsage =
    "ckptfs cat SRC VIEW_PATH [--tag T] [--strict] [--strip-prefix P] [--config FILE] [-o FILE|--output "
    "FILE]\n"
    "       (SRC s3://BUCKET/PREFIX: [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign])";

constexpr const char* kHelp =
    R"(usage: ckptfs cat SRC VIEW_PATH [--tag T] [--strict] [--strip-prefix P] [--config FILE] [-o FILE|--output FILE]
       (SRC s3://BUCKET/PREFIX: [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign])

Writes one file of the tree `ckptfs SRC MNT` mounts to stdout, or to FILE, without FUSE: the bytes a read
of MNT/VIEW_PATH returns, read in chunks of 8 MiB (memory stays at two chunks, whatever the file's size).
VIEW_PATH is relative to the mount's root (docs/mount.md): model.safetensors, fp32/model.safetensors,
fp32/pytorch_model.bin, hf/config.json, universal/<tag>_universal/zero/<param>/fp32.pt, tags/<tag>/...,
a side file such as config.json, ckptfs.json.

  --tag T                 the tree of `ckptfs --tag T SRC MNT`: tag T alone, at the root
  --strict                refuse SRC when any of its tags fails to read
  --strip-prefix P        strip the wrapper prefix P from the model's names (`-o strip_prefix=P`)
  --config FILE           the model's config.json where none lies beside SRC (`-o config=FILE`)
  -o FILE, --output FILE  write FILE (as FILE.partial, renamed once complete; a device or FIFO such as
                          /dev/null in place) instead of stdout; - is stdout

A progress bar is drawn on stderr when stderr is a terminal and the bytes do not go to one.

Exit codes (docs/exit-codes.md): 0 written; 2 usage, also when VIEW_PATH names nothing or a directory (the
message lists what is there); 3 source unreadable, also a source that fails or changes while the file is
read (stdout then has the bytes before it, FILE is not created); 4 invalid checkpoint; 5 unsupported
layout; 7 FILE or stdout cannot be written. A reader that closes the pipe early (`| head -c 100`) ends
ckptfs quietly, as it ends cat: by SIGPIPE (status 141 in a shell).
)";

constexpr size_t kNamesShown = 8;

// "a, b/, c" and how many more `dir` holds.
std::string listing(const vfs::VirtualTree& tree, const vfs::Node& dir, std::string_view near) {
  const auto names = vfs::closest_names(tree, dir, near, kNamesShown);
  if (names.empty()) return "nothing";
  std::string out = fmt::format("{}", fmt::join(names, ", "));
  if (dir.children.size() > names.size())
    out += fmt::format(" and {} more", dir.children.size() - names.size());
  return out;
}

std::string where(const vfs::VirtualTree& tree, const vfs::Node& dir) {
  return dir.ino == vfs::kRootIno ? std::string("the root") : tree.path(dir.ino) + "/";
}

// The regular file VIEW_PATH names; a UsageError that lists what is there when it names nothing or a
// directory.
const vfs::Node& find_file(const vfs::VirtualTree& tree, const std::string& view, const std::string& source) {
  const vfs::PathLookup found = vfs::lookup_path(tree, view);
  if (found.node == nullptr)
    throw UsageError(fmt::format(
        "{}: no such file in the mount of {}; {} holds {} (every view: `ckptfs inspect "
        "{}`)",
        view, source, where(tree, *found.deepest), listing(tree, *found.deepest, found.missing), source));
  if (found.node->is_dir)
    throw UsageError(fmt::format("{}: is a directory in the mount of {}, holding {}; name one of its files",
                                 view.empty() ? "/" : view, source, listing(tree, *found.node, "")));
  return *found.node;
}

// Ends the process as the default action of SIGPIPE would have: a pipeline sees the status of a reader
// that stopped early, whether or not SIGPIPE was ignored when ckptfs started.
[[noreturn]] void end_by_sigpipe() {
  std::signal(SIGPIPE, SIG_DFL);
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_UNBLOCK, &pipe, nullptr);
  ::raise(SIGPIPE);
  std::_Exit(128 + SIGPIPE);
}

}  // namespace

int run_cat(std::span<const std::string> args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "-h" || a == "--help"; })) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  try {
    const Arguments a = parse_arguments(args, {"--strict", "--output"}, 2, kCatUsage);
    const std::string& view = a.positional[1];
    const std::string output = a.output.value_or("-");
    io::Runtime runtime;
    const io::SourcePtr source = open_source(a.positional[0], a.s3, runtime);
    if (output != "-" && !source->is_remote() && is_inside(output, source->root()))
      throw UsageError(
          fmt::format("{}: is inside the source directory; ckptfs never writes to the source", output));
    const OpenOptions options = a.open_options();
    const Checkpoint checkpoint = open_checkpoint(*source, options);
    vfs::TreeOptions tree_options;
    // one cache for hf/'s and gguf/'s transposed tensors
    tree_options.gguf.transpose_cache = options.transpose_cache;
    const vfs::VirtualTree tree = vfs::build_tree(*source, checkpoint, tree_options);
    const vfs::Node& node = find_file(tree, view, a.positional[0]);
    const views::VirtualFilePtr layout = node.file->open_layout();
    const views::VirtualFile& content = layout ? *layout : *node.file;
    const auto unchanged = [&] { check_sources_unchanged(content, view); };
    Progress progress(content.size(), output != "-" || ::isatty(STDOUT_FILENO) != 1);
    progress.set_label(tree.path(node.ino));
    if (output == "-") {
      stream_view(content, view, STDOUT_FILENO, "stdout", progress);
      unchanged();
    } else {
      write_view(content, view, output, progress, unchanged);
    }
    progress.finish();
    return 0;
  } catch (const OutputClosed&) {
    end_by_sigpipe();
  } catch (const std::exception& e) {
    return report_error(e);
  }
}

}  // namespace ckptfs::cli
