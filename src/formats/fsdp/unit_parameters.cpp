#include "formats/fsdp/unit_parameters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <set>

#include "formats/name_prefix.hpp"

namespace ckptfs::formats::fsdp {

namespace fs = std::filesystem;

namespace {

// Where config.json's parameters disagree with the optimizer's record of the same run (a shape, or a name
// the architecture lacks): config.json is not this model's.
std::optional<std::string> disagreement(const HfLayout& layout, const std::string& prefix,
                                        const std::map<std::string, std::vector<int64_t>>& shapes,
                                        const fs::path& optimizer_dir) {
  std::set<std::string> known;
  for (const auto& p : layout.parameters) {
    known.insert(prefix + p.name);
    const auto it = shapes.find(prefix + p.name);
    if (p.tied_to.empty() && it != shapes.end() && it->second != p.shape)
      return fmt::format("{}/.metadata has {} [{}], config.json's {} makes it [{}]",
                         optimizer_dir.filename().string(), it->first, fmt::join(it->second, ", "),
                         architecture_name(layout.family), fmt::join(p.shape, ", "));
  }
  for (const auto& [name, shape] : shapes)
    if (!known.contains(name))
      return fmt::format("{}/.metadata has {}, which config.json's {} lacks",
                         optimizer_dir.filename().string(), name, architecture_name(layout.family));
  return std::nullopt;
}

// Each name's pieces (use_orig_params), in the order the units list them.
std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> pieces_by_name(
    const std::vector<FlatUnit>& units) {
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> out;
  for (const auto& u : units)
    for (const auto& p : u.pieces) out[p.name].emplace_back(p.first, p.count);
  return out;
}

// The optimizer's shapes in the order `order` lists the names; a name the optimizer does not list whose
// pieces are an earlier one's is that parameter tied (FSDP flattened it once, the optimizer holds it once).
std::vector<HfParameter> listed_parameters(const std::vector<std::string>& order,
                                           const OptimizerRecord& optimizer,
                                           const std::vector<FlatUnit>& units) {
  const auto pieces = pieces_by_name(units);
  std::vector<HfParameter> out;
  for (const auto& name : order) {
    if (const auto it = optimizer.shapes.find(name); it != optimizer.shapes.end()) {
      out.push_back({name, it->second, ""});
      continue;
    }
    const auto mine = pieces.find(name);
    if (mine == pieces.end()) continue;
    for (const auto& p : out)
      if (p.tied_to.empty() && pieces.contains(p.name) && pieces.at(p.name) == mine->second) {
        out.push_back({name, p.shape, p.name});
        break;
      }
  }
  return out;
}

}  // namespace

std::variant<UnitParameters, std::string> unit_parameters(
    const std::vector<FlatUnit>& units, const RankStateDict& rank0,
    const std::variant<HfLayout, std::string>& config, const OptimizerRecord& optimizer,
    const fs::path& optimizer_dir, const OpenOptions& options, std::vector<std::string>& notes) {
  const auto* given = std::get_if<std::string>(&config);
  std::string why = given != nullptr ? *given : "";
  if (const auto* layout = std::get_if<HfLayout>(&config)) {
    std::vector<std::string> names;  // the nested units' modules and the pieces' parameters
    for (const auto& u : units) {
      if (!u.module.empty()) names.push_back(u.module);
      for (const auto& p : u.pieces) names.push_back(p.name);
    }
    std::string prefix = options.strip_prefix.value_or(layout_prefix(names, *layout).value_or(""));
    const auto differs = disagreement(*layout, prefix, optimizer.shapes, optimizer_dir);
    if (!differs)
      return UnitParameters{layout->parameters, std::move(prefix),
                            fmt::format("config.json's {}", architecture_name(layout->family))};
    why = "config.json is not this model's: " + *differs;
    notes.push_back(why);
  }
  const std::string dir = optimizer_dir.filename().string();
  auto by_pieces = listed_parameters(rank0.names, optimizer, units);
  if (!by_pieces.empty())
    return UnitParameters{std::move(by_pieces),
                          "",  // names as saved: any prefix goes in strip_wrapper_prefixes
                          fmt::format("the rank files' names with {}/'s shapes", dir)};
  auto by_groups = listed_parameters(optimizer.order, optimizer, units);
  if (!by_groups.empty())
    return UnitParameters{std::move(by_groups), "", fmt::format("{}/'s parameter groups and shapes", dir)};
  return why + (optimizer.shapes.empty() ? "" : fmt::format("; {}/ names no parameter", dir));
}

}  // namespace ckptfs::formats::fsdp
