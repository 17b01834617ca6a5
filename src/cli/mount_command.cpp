// `ckptfs SRC MNT [-o opt,...] [-f] [-d] [--tag T]`: indexes the checkpoint and builds the whole tree,
// then mounts it. Every checkpoint error surfaces here, before anything is mounted.
#include <fmt/format.h>
#include <fuse_opt.h>
#include <malloc.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/fuse.hpp"
#include "ckptfs/index.hpp"
#include "ckptfs/io.hpp"
#include "ckptfs/layout.hpp"
#include "ckptfs/vfs.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/live_run.hpp"
#include "cli/source_argument.hpp"
#include "io/runtime.hpp"
#include "views/gguf/gguf_naming.hpp"

namespace ckptfs::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMountUsage = "ckptfs SRC MNT [-o opt,...] [-f] [-d] [--tag T]";

constexpr const char* kMountHelp = R"(usage: ckptfs SRC MNT [-o opt,...] [-f] [-d] [--tag T]
       ckptfs mount SRC MNT [...]

Mounts the merged views of checkpoint SRC read-only on MNT (layout: docs/mount.md). Returns once the
mount is live; the server keeps running in the background until `fusermount3 -u MNT` or SIGTERM.

  -f              stay in the foreground
  -d              foreground, with libfuse's request trace on stderr
  --tag T         serve only tag T (at the root and under tags/T/)
  --endpoint URL, --region R, --s3-path-style, --s3-no-sign
                  for an s3:// SRC, as in inspect and export: -o endpoint=URL, region=R, s3_path_style,
                  s3_no_sign (which win where both are given)
  -o opt,...      mount options, comma-separated:
     threads=N        at most N server threads (default 16)
     max_open=N       at most N source files held open at once (default half the open-file limit,
                      which ckptfs raises to the hard limit, at most 65536); others are reopened
                      on demand and checked to be the file that was indexed
     tag=T            the same as --tag T
     strict           refuse SRC when any of its tags fails to read (default: only the tag served at
                      the root must be valid; a broken other tag, such as an older step or a damaged
                      <tag>_universal/ beside a good tag, is left out, with its error in the log,
                      `ckptfs inspect` and ckptfs.json)
     strip_prefix=P   strip the wrapper prefix P (a LightningModule's "model.", DDP's "module.")
                      from the model's names (default: the one that makes them config.json's
                      architecture's, where config.json names one)
     config=FILE      the model's config.json where none lies beside the checkpoint (an FSDP
                      LOCAL_STATE_DICT save names no parameter: its architecture cuts them), served
                      as config.json
     read_ahead_kb=N  kernel readahead of the mount in KiB (default 1024, set when run as root;
                      0 keeps the kernel's default, 128)
     prefetch=MB      how far ahead of a sequential reader the source ranges it will need are
                      prefetched into the page cache, in each shard's order, in place of the
                      kernel's readahead on the shards (default 32; 0: off, the kernel's instead)
     source_check_ms=N  how long a check that a source file is unchanged holds for the opens that
                      follow (default 1000; 0: every open stats every source of the file opened)
     decoded_cache_mb=N  memory for decoded compressed items (DCP's ZStandard extension), in MiB
                      (default 256; 0: none); an item larger than it is decoded again for each read,
                      streamed to the range asked for
     transpose_cache_mb=N  memory for the tiles transposed tensors (GPT-2's Conv1D weights in hf/) are
                      served from, shared by all server threads, in MiB (default 128, at least 1)
     endpoint=URL     for an s3://BUCKET/PREFIX SRC: the store (default AWS_ENDPOINT_URL, else AWS's
                      https://s3.REGION.amazonaws.com); credentials from AWS_ACCESS_KEY_ID /
                      AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else AWS_PROFILE in ~/.aws/credentials
                      (never on the command line: docs/s3.md)
     region=R         the store's region (default AWS_REGION, AWS_DEFAULT_REGION, else us-east-1)
     s3_path_style    http://HOST/BUCKET/KEY addressing (the default for a custom endpoint)
     s3_no_sign       anonymous requests (a public bucket)
     cache_mb=N       s3:// sources: memory for fetched bytes, in MiB (default a 16th of the machine's
                      memory, 256-1024; LRU, GETs in flight included: docs/s3.md)
     cache_dir=DIR    s3:// sources: also keep fetched bytes in DIR, reused by later mounts and
                      checked against each object's ETag; cache_dir_mb=N bounds it (default 8192)
     s3_connections=N s3:// sources: at most N ranged GETs in flight (default 16)
     gguf_pre=NAME    name the model's pre-tokenizer (tokenizer.ggml.pre: gpt-2, llama-bpe, qwen2, ...)
                      in gguf/ where ckptfs cannot find it as llama.cpp's converter does (by encoding
                      its check text; ckptfs encodes GPT-2's, Llama 3's and Qwen2's: docs/formats/gguf.md)
     gguf_name=NAME   gguf/ holds what the converter writes for a model directory named NAME
                      (default hf): general.name, basename, version, size label and file names
                      follow from it as llama.cpp's naming heuristics make them (docs/formats/gguf.md)
     shard_size=SIZE  serve each safetensors view larger than SIZE as save_pretrained(max_shard_size=
                      SIZE) writes it: model-0000I-of-0000N.safetensors + model.safetensors.index.json,
                      its single file under unsharded/ (default 50GB, transformers' own; SIZE: 500MB,
                      1.5GB, 60KB decimal, 512MiB binary, or bytes; docs/mount.md)
     static           serve SRC as it is at the mount (default for a save dir: follow it as the run
                      saves, docs/mount.md#live-runs: a new tag appears once its save is complete,
                      the root follows the tracker, a deleted tag goes)
     refresh=SECONDS  a live mount of an s3:// SRC, or of a save dir on a filesystem that sends no
                      change events (NFS, Lustre, GPFS, CephFS, SMB, FUSE), lists it again this often
                      (default 30; one LIST request per 1,000 objects each time)
     stats            add ckptfs-stats.json at the root: the daemon's figures (bytes served per
                      file so far, and for s3:// sources what was fetched) at each open
     index_cache=DIR  where the index of SRC is kept (default $XDG_CACHE_HOME/ckptfs, else
                      ~/.cache/ckptfs); a mount of unchanged sources loads it instead of parsing;
                      index_cache=off neither reads nor writes one (docs/mount.md)
     uid=N, gid=N     show every node as owned by user N / group N (numbers), in place of the owners of
                      the sources it is made of
     umask=OOO        show files as 0444 & ~OOO and directories as 0555 & ~OOO (octal), in place of the
                      read bits the sources grant (docs/mount.md#permissions)
     allow_other, fsname=..., and the other FUSE mount options (mount.fuse3(8)) are passed to libfuse;
     ro and default_permissions are always set (the kernel checks every node's owner and mode, which
     come from the sources), rw and defaults are ignored.

Exit codes (docs/exit-codes.md): 0 mounted, 2 usage, 3 source unreadable, 4 invalid checkpoint,
5 unsupported layout, 6 mount failed.
)";

// How often a live mount lists an s3:// source, or a save dir on a filesystem without change events, again.
constexpr std::chrono::seconds kDefaultRefresh{30};

struct MountArguments {
  std::string source_text;  // as given: a path, or s3://BUCKET/PREFIX
  io::SourcePtr source;     // opened once the Runtime is made
  fs::path mountpoint;
  s3::Options s3;
  // -o cache_mb=, cache_dir=, cache_dir_mb=, s3_connections=, max_open=, decoded_cache_mb=
  io::RuntimeOptions runtime;
  OpenOptions open;
  fuse::ServeOptions serve;
  bool stats_file = false;  // -o stats
  ShardOptions shards;      // -o shard_size=
  GgufOptions gguf;         // -o gguf_pre=
  std::optional<unsigned> transpose_cache_mb;
  std::optional<fs::path> index_cache = index::default_cache_dir();  // nullopt: off
  bool snapshot = false;                                             // -o static
  std::chrono::seconds refresh{kDefaultRefresh};                     // -o refresh=
};

// "key=OOO": an octal umask, at most 0777.
mode_t parse_umask(const std::string& option) {
  const std::string_view value = std::string_view(option).substr(option.find('=') + 1);
  unsigned mask = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mask, 8);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || mask > 0777)
    throw UsageError(fmt::format("-o {}: expected an octal mask such as 022 or 0027", option));
  return static_cast<mode_t>(mask);
}

// Escapes a value for libfuse's comma-separated option list.
std::string escape_option(const std::string& value) {
  std::string out;
  for (char ch : value) {
    if (ch == ',' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

// "key=N" with N >= minimum.
unsigned parse_number(const std::string& option, unsigned minimum) {
  const std::string_view value = std::string_view(option).substr(option.find('=') + 1);
  unsigned n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < minimum)
    throw UsageError(fmt::format("-o {}: expected a number >= {}", option, minimum));
  return n;
}

void add_mount_option(MountArguments& m, const std::string& option) {
  if (option.empty() || option == "ro" || option == "rw" || option == "defaults") return;
  if (option.starts_with("tag=")) {
    m.open.tag = option.substr(4);
  } else if (option == "strict") {
    m.open.strict = true;
  } else if (option.starts_with("strip_prefix=")) {
    m.open.strip_prefix = option.substr(13);
  } else if (option.starts_with("config=")) {
    m.open.model_config = model_config_path(option.substr(7));
  } else if (option == "static") {
    m.snapshot = true;
  } else if (option.starts_with("refresh=")) {
    m.refresh = std::chrono::seconds(parse_number(option, 1));
  } else if (option == "stats") {
    m.stats_file = true;
  } else if (option.starts_with("gguf_pre=")) {
    if (option.size() == 9)
      throw UsageError(fmt::format("-o {}: expected a pre-tokenizer name such as gpt-2", option));
    m.gguf.pre = option.substr(9);
  } else if (option.starts_with("gguf_name=")) {
    if (!views::gguf::valid_directory_name(option.substr(10)))
      throw UsageError(
          fmt::format("-o {}: expected a directory name such as checkpoint-500 (ASCII letters, "
                      "digits, '.', '_', '-')",
                      option));
    m.gguf.name = option.substr(10);
  } else if (option.starts_with("shard_size=")) {
    m.shards.max_shard_size = parse_shard_size_option("-o " + option, option.substr(11));
  } else if (option.starts_with("uid=")) {
    m.serve.access.uid = parse_number(option, 0);
  } else if (option.starts_with("gid=")) {
    m.serve.access.gid = parse_number(option, 0);
  } else if (option.starts_with("umask=")) {
    m.serve.access.umask = parse_umask(option);
  } else if (option.starts_with("threads=")) {
    m.serve.max_threads = parse_number(option, 1);
  } else if (option.starts_with("max_open=")) {
    m.runtime.max_open_files = parse_number(option, 1);
  } else if (option.starts_with("decoded_cache_mb=")) {
    m.runtime.decoded_cache_bytes = uint64_t{parse_number(option, 0)} << 20;
  } else if (option.starts_with("transpose_cache_mb=")) {
    m.transpose_cache_mb = parse_number(option, 1);
  } else if (option.starts_with("index_cache=")) {
    const std::string dir = option.substr(12);
    if (dir.empty()) throw UsageError(fmt::format("-o {}: expected a directory or 'off'", option));
    m.index_cache = dir == "off" ? std::nullopt : std::optional<fs::path>(fs::absolute(dir));
  } else if (option.starts_with("endpoint=")) {
    m.s3.endpoint = option.substr(9);
  } else if (option.starts_with("region=")) {
    m.s3.region = option.substr(7);
  } else if (option == "s3_path_style") {
    m.s3.path_style = true;
  } else if (option == "s3_no_sign") {
    m.s3.no_sign = true;
  } else if (option.starts_with("cache_mb=")) {
    m.runtime.remote.memory_bytes = uint64_t{parse_number(option, 1)} << 20;
  } else if (option.starts_with("cache_dir=")) {
    if (option.size() == 10) throw UsageError(fmt::format("-o {}: expected a directory", option));
    m.runtime.remote.dir = fs::absolute(option.substr(10));
  } else if (option.starts_with("cache_dir_mb=")) {
    m.runtime.remote.dir_bytes = uint64_t{parse_number(option, 1)} << 20;
  } else if (option.starts_with("s3_connections=")) {
    m.runtime.remote.connections = parse_number(option, 1);
  } else if (option.starts_with("prefetch=")) {
    m.serve.prefetch_mb = parse_number(option, 0);
  } else if (option.starts_with("source_check_ms=")) {
    m.serve.source_check_ms = parse_number(option, 0);
  } else if (option.starts_with("read_ahead_kb=")) {
    m.serve.read_ahead_kb = parse_number(option, 0);
  } else {
    m.serve.fuse_options.push_back(escape_option(option));  // split once already: keep its commas
  }
}

// The options of one -o list, split by libfuse's own parser (so "\," is a comma inside a value).
std::vector<std::string> split_options(const std::string& list) {
  std::vector<std::string> out;
  const char* argv[] = {"ckptfs", "-o", list.c_str()};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
  const fuse_opt none[] = {FUSE_OPT_END};
  const auto collect = [](void* data, const char* arg, int key, fuse_args*) {
    if (key == FUSE_OPT_KEY_OPT) static_cast<std::vector<std::string>*>(data)->emplace_back(arg);
    return 0;  // consumed
  };
  const int rc = fuse_opt_parse(&args, &out, none, collect);
  fuse_opt_free_args(&args);
  if (rc != 0)
    throw UsageError(fmt::format("-o {}: cannot parse the option list\nusage: {}", list, kMountUsage));
  return out;
}

MountArguments parse(int argc, char** argv) {
  MountArguments m;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-o" || (a.starts_with("-o") && a.size() > 2)) {
      if (a == "-o" && ++i >= argc) throw UsageError(fmt::format("-o needs a value\nusage: {}", kMountUsage));
      for (const auto& option : split_options(a == "-o" ? argv[i] : a.substr(2))) add_mount_option(m, option);
    } else {
      rest.push_back(std::move(a));
    }
  }
  Arguments a = parse_arguments(rest, {"-f", "-d"}, 2, kMountUsage);
  if (a.tag) m.open.tag = a.tag;
  // The flags inspect, export, index and cat take for an s3:// SRC mean the same here (-o spells them for
  // fstab, and wins where both are given).
  if (!m.s3.endpoint) m.s3.endpoint = a.s3.endpoint;
  if (!m.s3.region) m.s3.region = a.s3.region;
  m.s3.path_style = m.s3.path_style || a.s3.path_style;
  m.s3.no_sign = m.s3.no_sign || a.s3.no_sign;
  m.serve.foreground = a.has("-f");
  m.serve.debug = a.has("-d");
  m.source_text = a.positional[0];
  // Absolute paths: the daemon runs in "/", and the sources are re-checked by path on every open.
  m.mountpoint = fs::absolute(a.positional[1]).lexically_normal();
  const auto has = [&](std::string_view key) {
    return std::any_of(m.serve.fuse_options.begin(), m.serve.fuse_options.end(),
                       [&](const std::string& o) { return o.starts_with(key); });
  };
  // fsname = the source, as sshfs does: df and /proc/mounts show what is mounted, and `mount -a` can
  // tell that an fstab line is already mounted.
  const std::string shown =
      s3::is_s3_url(m.source_text) ? m.source_text : fs::absolute(m.source_text).lexically_normal().string();
  if (!has("fsname=")) m.serve.fuse_options.push_back("fsname=" + escape_option(shown));
  if (!has("subtype=")) m.serve.fuse_options.push_back("subtype=ckptfs");
  return m;
}

bool may_follow(const MountArguments& m) {
  return !m.snapshot && !m.open.tag;
}

// A save dir (its tags are dirs below SRC) is followed as the run saves, unless -o static or one tag is asked
// for.
bool follows(const MountArguments& m, const Checkpoint& checkpoint) {
  return may_follow(m) && std::none_of(checkpoint.tags.begin(), checkpoint.tags.end(),
                                       [&](const Tag& t) { return t.dir == checkpoint.root; });
}

}  // namespace

int run_mount(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kMountHelp, stdout);
      return 0;
    }
  }
  try {
    MountArguments m = parse(argc, argv);
    m.serve.mountpoint = fuse::check_mountpoint(m.mountpoint.string());  // before the long indexing
    // With prefetch on, the kernel's own readahead on the sources is off from the first read of the
    // indexing on: a readahead window it opens there leaves a marker page that a later read of the masters
    // hits, and the chain of readaheads that follows (which FADV_RANDOM set afterwards does not stop) reads
    // each shard to its end.
    m.runtime.kernel_readahead = m.serve.prefetch_mb == 0;
    io::Runtime runtime(m.runtime);
    m.source = open_source(m.source_text, m.s3, runtime);
    if (m.transpose_cache_mb)
      m.open.transpose_cache = catalog::make_transpose_cache(uint64_t{*m.transpose_cache_mb} << 20);
    m.gguf.transpose_cache = m.open.transpose_cache;  // one cache for hf/'s and gguf/'s transposed tensors
    // A live mount serves complete saves only, from the first look: a save in progress at the mount waits
    // for its framework's mark like one begun later.
    if (may_follow(m)) m.open = complete_saves_only(std::move(m.open));
    const index::Opened opened = index::open_indexed(m.source, m.open, m.index_cache);
    m.serve.once_live = [&opened] { return index::save_index(opened); };
    if (m.serve.foreground && !opened.index_file.empty())
      fmt::print(stderr, "ckptfs: {}\n",
                 opened.from_index ? fmt::format("index loaded from {}", opened.index_file.string())
                                   : fmt::format("parsed the sources ({}); index {}", opened.parsed_because,
                                                 opened.index_file.string()));
    for (const auto& l : opened.checkpoint.left_out)
      fmt::print(stderr, "ckptfs: left out tag {} (-o strict refuses instead): {}\n", l.name, l.error);
    vfs::TreeOptions tree_options{m.stats_file ? runtime.stats() : nullptr, m.shards, {}, m.gguf};
    std::optional<LiveRun> live;
    if (follows(m, opened.checkpoint)) {
      live.emplace(LiveRun::Options{m.source, m.open, tree_options, m.refresh, opened.index_file, opened.key},
                   opened.checkpoint);
      tree_options.live = live->description();
      m.serve.follow = [&live](const fuse::ReplaceTree& replace,
                               const std::function<void(const std::string&)>& log,
                               std::stop_token stop) { live->follow(replace, log, stop); };
    }
    auto tree =
        std::make_shared<const vfs::VirtualTree>(vfs::build_tree(*m.source, opened.checkpoint, tree_options));
    // Indexing parsed every pickle into trees that are gone now; hand their pages back before serving.
    ::malloc_trim(0);
    fuse::serve(tree, m.serve, runtime);
    return 0;
  } catch (const std::exception& e) {
    return report_error(e);
  }
}

}  // namespace ckptfs::cli
