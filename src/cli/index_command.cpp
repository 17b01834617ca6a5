// `ckptfs index SRC [--tag T] [--cache DIR]`: parses SRC and writes the index a later mount of SRC (with
// the same --tag) loads instead of parsing; e.g. right after a checkpoint is written, on the cluster's
// login node.
#include <fmt/format.h>

#include "ckptfs/index.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/source_argument.hpp"

namespace ckptfs::cli {

namespace {

constexpr const char* kIndexUsage =
    "ckptfs index SRC [--tag T] [--strict] [--strip-prefix P] [--config FILE] [--cache DIR]\n"
    "       (SRC s3://BUCKET/PREFIX: [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign])";

}  // namespace

int run_index(std::span<const std::string> args) {
  try {
    Arguments a = parse_arguments(args, {"--strict"}, 1, kIndexUsage);
    const OpenOptions options = complete_saves_only(a.open_options());  // what a mount of SRC loads
    const auto dir = a.cache ? std::optional<std::filesystem::path>(std::filesystem::absolute(*a.cache))
                             : index::default_cache_dir();
    if (!dir)
      throw UsageError(fmt::format("no cache dir: set XDG_CACHE_HOME or HOME, or give --cache DIR\nusage: {}",
                                   kIndexUsage));
    io::Runtime runtime;
    const auto source = open_source(a.positional[0], a.s3, runtime);
    fmt::print("{}\n", index::write_index(*source, options, *dir).string());
    return 0;
  } catch (const std::exception& e) {
    return report_error(e);
  }
}

}  // namespace ckptfs::cli
