// Minimal parser for the inspect/export/index command lines: positionals, boolean flags, --tag T and
// --cache DIR.
#pragma once

#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "ckptfs/error.hpp"

namespace ckptfs::cli {

struct UsageError : Error {
  explicit UsageError(const std::string& message) : Error(ExitCode::usage, message) {}
};

struct Arguments {
  std::vector<std::string> positional;
  std::set<std::string> flags;  // e.g. "--json"
  std::optional<std::string> tag;
  std::optional<std::string> cache;  // --cache DIR (`ckptfs index`)

  bool has(const std::string& flag) const { return flags.count(flag) != 0; }
  // --tag T and --strict as options for open_checkpoint.
  OpenOptions open_options() const { return {tag, has("--strict")}; }
};

// Throws UsageError on an unknown flag or a wrong number of positionals.
Arguments parse_arguments(std::span<const std::string> args, const std::set<std::string>& known_flags,
                          size_t positionals, const char* usage);

}  // namespace ckptfs::cli
