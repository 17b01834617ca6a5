#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ckptfs/error.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/version.hpp"
#include "cli/commands.hpp"

namespace {

constexpr const char* kCommandsUsage = R"(usage:
  ckptfs SRC MNT [-o opt,...] [-f] [-d]     mount the merged views of checkpoint SRC on MNT
  ckptfs mount SRC MNT [...]                the same
  ckptfs inspect SRC [--tag T] [--strict] [--strip-prefix P] [--config FILE] [--json] [--tensors]
  ckptfs export SRC OUT [--tag T] [--strict] [--strip-prefix P] [--config FILE] [--universal] [--shard-size SIZE]
                                            write OUT/model.safetensors, OUT/fp32/pytorch_model.bin,
                                            OUT/fp32/model.safetensors (and OUT/universal/); views over
                                            SIZE (default 50GB) sharded as save_pretrained does
  ckptfs cat SRC VIEW_PATH [--tag T] [--strict] [--strip-prefix P] [--config FILE] [-o FILE]
                                            write one file of the mount of SRC (fp32/model.safetensors,
                                            hf/config.json, ...) to stdout or FILE, without FUSE
  ckptfs index SRC [--tag T] [--strict] [--strip-prefix P] [--config FILE] [--cache DIR]
                                            write the index a later mount of SRC loads instead of
                                            parsing (default DIR: $XDG_CACHE_HOME/ckptfs)
  --strict: refuse SRC when any tag fails to read (default: broken tags but the root one are left out)
  --strip-prefix P: strip the wrapper prefix P from the model's names (default: the one that makes them
    config.json's architecture's, where config.json names one)
  --config FILE: the model's config.json where none lies beside SRC (an FSDP LOCAL_STATE_DICT save)
  inspect, export, index and cat of an s3://BUCKET/PREFIX SRC also take
    [--endpoint URL] [--region R] [--s3-path-style] [--s3-no-sign]   (a mount too, or -o endpoint=, ...)
  ckptfs --help | --version                 this text | the version and git revision of this build
Run `ckptfs mount --help` for the mount options, `ckptfs cat --help` for cat's. Exit codes:
docs/exit-codes.md. Manual: man ckptfs.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace ckptfs;
  if (argc < 2) {
    std::fputs(kCommandsUsage, stderr);
    return static_cast<int>(ExitCode::usage);
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kCommandsUsage, stdout);
    return 0;
  }
  if (command == "--version" || command == "-V") {
    fmt::print("{}\n", version::version_line());
    return 0;
  }
  // Thousands of rank files stay within the fd cache's bound. Where the limit allows, every rank file of a
  // large save dir stays open (a reopen costs an open and a stat on the read path, and a merged tensor reads
  // every rank): each command's io::Runtime keeps half the raised limit open (io::default_max_open_files).
  io::raise_open_file_limit();
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (command == "inspect") return cli::run_inspect(rest);
  if (command == "export") return cli::run_export(rest);
  if (command == "index") return cli::run_index(rest);
  if (command == "cat") return cli::run_cat(rest);
  if (command == "mount") {
    argv[1] = argv[0];
    return cli::run_mount(argc - 1, argv + 1);
  }
  // Mount options may come first: `ckptfs --tag T SRC MNT`, `ckptfs -o ro SRC MNT`.
  const bool mount_option = command == "-o" || command.starts_with("-o") || command == "-f" ||
                            command == "-d" || command == "--tag";
  if (!command.empty() && command[0] == '-' && !mount_option) {
    fmt::print(stderr, "ckptfs: unknown option '{}'\n{}", command, kCommandsUsage);
    return static_cast<int>(ExitCode::usage);
  }
  return cli::run_mount(argc, argv);
}
