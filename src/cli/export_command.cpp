// `ckptfs export SRC OUT [--tag T] [--universal] [--shard-size SIZE]`: streams the views of a tag into OUT
// with bounded memory; the universal/ tree (optimizer state included, about three times the fp32 bytes) on
// request; safetensors views larger than SIZE as save_pretrained shards them (without the mount's
// unsharded/ copy).
#include <fmt/format.h>

#include <filesystem>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/io_tree.hpp"
#include "ckptfs/layout.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/source_argument.hpp"
#include "cli/view_output.hpp"

namespace ckptfs::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExportUsage =
    "ckptfs export SRC OUT [--tag T] [--strict] [--strip-prefix P] [--config FILE] [--universal] "
    "[--shard-size SIZE]\n"
    "       (SRC s3://BUCKET/PREFIX: [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign])";

}  // namespace

int run_export(std::span<const std::string> args) {
  try {
    Arguments a = parse_arguments(args, {"--universal", "--strict", "--shard-size"}, 2, kExportUsage);
    ShardOptions shards{.unsharded_copy = false};
    if (a.shard_size) shards.max_shard_size = parse_shard_size_option("--shard-size", *a.shard_size);
    io::Runtime runtime;
    const io::SourcePtr source = open_source(a.positional[0], a.s3, runtime);
    const fs::path out = a.positional[1];
    if (!source->is_remote() && is_inside(out, source->root()))
      throw UsageError(
          fmt::format("{}: is inside the source directory; ckptfs never writes to the source", out.string()));
    const OpenOptions options = a.open_options();
    Checkpoint cp = open_checkpoint(*source, options);
    const Tag& tag = cp.latest_tag();
    GgufOptions gguf;
    gguf.transpose_cache = options.transpose_cache;  // one cache for hf/'s and gguf/'s transposed tensors
    const auto views = tag_views(*source, tag, a.has("--universal"), shards, gguf);
    uint64_t total = 0;
    for (const auto& v : views) total += v.file->size();
    Progress progress(total);
    for (const auto& v : views) {
      const fs::path path = out / v.path;
      std::error_code ec;
      fs::create_directories(path.parent_path(), ec);
      if (ec)
        throw OutputError(
            fmt::format("{}: cannot create directory: {}", path.parent_path().string(), ec.message()));
      progress.set_label(v.path);
      write_view(*v.file, v.path, path, progress);
    }
    progress.finish();
    return 0;
  } catch (const std::exception& e) {
    return report_error(e);
  }
}

}  // namespace ckptfs::cli
