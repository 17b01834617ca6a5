#include "cli/arguments.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ckptfs/sharding.hpp"

namespace ckptfs::cli {

uint64_t parse_shard_size_option(const std::string& what, std::string_view size) {
  try {
    return views::parse_shard_size(size);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("{}: {}", what, e.what()));
  }
}

std::filesystem::path model_config_path(const std::string& path) {
  std::error_code ec;
  const auto absolute = std::filesystem::absolute(path, ec);
  if (ec || !std::filesystem::is_regular_file(absolute, ec))
    throw UsageError(fmt::format("config {}: no such file (the model's config.json)", path));
  return absolute;
}

OpenOptions Arguments::open_options() const {
  OpenOptions o{tag, has("--strict"), nullptr, strip_prefix, std::nullopt};
  if (config) o.model_config = model_config_path(*config);
  return o;
}

Arguments parse_arguments(std::span<const std::string> args, const std::set<std::string>& known_flags,
                          size_t positionals, const char* usage) {
  Arguments out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::pair<std::string_view, std::optional<std::string>*> valued[] = {
        {"--tag", &out.tag},
        {"-t", &out.tag},
        {"--strip-prefix", &out.strip_prefix},
        {"--config", &out.config},
        {"--cache", &out.cache},
        {"--shard-size", &out.shard_size},
        {"--endpoint", &out.s3.endpoint},
        {"--region", &out.s3.region},
        {"--output", &out.output},
        {"-o", &out.output}};
    const auto named = std::find_if(std::begin(valued), std::end(valued), [&](const auto& v) {
      // options of one command only: elsewhere they are unknown options, not silently ignored
      if (v.second == &out.output && !known_flags.count("--output")) return false;
      if (v.second == &out.shard_size && !known_flags.count("--shard-size")) return false;
      return a == v.first ||
             (a.starts_with(v.first) && a.size() > v.first.size() && a[v.first.size()] == '=');
    });
    if (named != std::end(valued)) {
      if (a.size() > named->first.size()) {
        *named->second = a.substr(named->first.size() + 1);
      } else {
        if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value\nusage: {}", a, usage));
        *named->second = args[++i];
      }
    } else if (a == "--s3-path-style") {
      out.s3.path_style = true;
    } else if (a == "--s3-no-sign") {
      out.s3.no_sign = true;
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
