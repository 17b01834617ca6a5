#include "cli/arguments.hpp"

#include <fmt/format.h>

namespace ckptfs::cli {

Arguments parse_arguments(std::span<const std::string> args, const std::set<std::string>& known_flags,
                          size_t positionals, const char* usage) {
  Arguments out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--tag" || a == "-t" || a == "--cache") {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value\nusage: {}", a, usage));
      (a == "--cache" ? out.cache : out.tag) = args[++i];
    } else if (a.rfind("--tag=", 0) == 0) {
      out.tag = a.substr(6);
    } else if (a.rfind("--cache=", 0) == 0) {
      out.cache = a.substr(8);
    } else if (known_flags.count(a)) {
      out.flags.insert(a);
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      throw UsageError(fmt::format("unknown option '{}'\nusage: {}", a, usage));
    } else {
      out.positional.push_back(a);
    }
  }
  if (out.positional.size() != positionals)
    throw UsageError(
        fmt::format("expected {} arguments, got {}\nusage: {}", positionals, out.positional.size(), usage));
  return out;
}

}  // namespace ckptfs::cli
