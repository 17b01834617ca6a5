// Minimal parser for the inspect/export/index/cat command lines: positionals ("-" among them), boolean
// flags, --tag T, --strip-prefix P, --config FILE, --cache DIR, -o/--output FILE and --shard-size SIZE (each
// only where it is among the known flags: elsewhere an unknown option), and for an s3:// SRC --endpoint URL,
// --region R, --s3-path-style, --s3-no-sign.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/error.hpp"
#include "ckptfs/s3.hpp"

namespace ckptfs::cli {

struct UsageError : Error {
  explicit UsageError(const std::string& message) : Error(ExitCode::usage, message) {}
};

struct Arguments {
  std::vector<std::string> positional;
  std::set<std::string> flags;  // e.g. "--json"
  std::optional<std::string> tag;
  std::optional<std::string> cache;         // --cache DIR (`ckptfs index`)
  std::optional<std::string> output;        // -o FILE, --output FILE (`ckptfs cat`)
  std::optional<std::string> shard_size;    // --shard-size SIZE (`ckptfs export`)
  std::optional<std::string> strip_prefix;  // --strip-prefix P
  std::optional<std::string> config;        // --config FILE
  s3::Options s3;

  bool has(const std::string& flag) const { return flags.count(flag) != 0; }
  // --tag T, --strict, --strip-prefix P and --config FILE as options for open_checkpoint
  // (--config FILE made absolute: a mount's daemon leaves the working directory.)
  OpenOptions open_options() const;
};

// FILE of --config / -o config=, absolute; throws UsageError when it is no regular file.
std::filesystem::path model_config_path(const std::string& path);

// SIZE of -o shard_size= / --shard-size (views::parse_shard_size); `what` names the option in the
// UsageError thrown for a bad one.
uint64_t parse_shard_size_option(const std::string& what, std::string_view size);

// Throws UsageError on an unknown flag or a wrong number of positionals.
Arguments parse_arguments(std::span<const std::string> args, const std::set<std::string>& known_flags,
                          size_t positionals, const char* usage);

}  // namespace ckptfs::cli
