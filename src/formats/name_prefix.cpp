#include "formats/name_prefix.hpp"

#include <fmt/format.h>

#include <map>
#include <set>

#include "ckptfs/error.hpp"

namespace ckptfs::formats {


std::optional<std::string> layout_prefix(const std::vector<std::string>& names, const HfLayout& layout) {
  std::set<std::string, std::less<>> own;  // the layout's parameter names and module paths
  for (const auto& p : layout.parameters)
    for (size_t dot = p.name.find('.'); ; dot = p.name.find('.', dot + 1)) {
      own.insert(p.name.substr(0, dot));
      if (dot == std::string::npos) break;
    }
  std::map<std::string, size_t> votes;
  for (const auto& name : names) {
    // the longest own suffix that starts at a name boundary: its prefix is the shortest
    for (size_t at = 0;;) {
      if (own.contains(std::string_view(name).substr(at))) {
        ++votes[name.substr(0, at)];
        break;
      }
      const size_t dot = name.find('.', at);
      if (dot == std::string::npos) break;
      at = dot + 1;
    }
  }
  std::optional<std::string> best;
  size_t most = 0;
  for (const auto& [prefix, n] : votes)
    if (n > most) best = prefix, most = n;
  return best;
}

std::shared_ptr<catalog::Catalog> strip_prefix(const catalog::Catalog& model, const std::string& prefix) {
  auto out = std::make_shared<catalog::Catalog>(model);
  std::set<std::string> seen;
  for (auto& t : out->tensors) {
    if (t.name.starts_with(prefix) && t.name.size() > prefix.size()) t.name.erase(0, prefix.size());
    if (!seen.insert(t.name).second)
      throw FormatError(fmt::format("{}: two tensors are named so once the prefix '{}' is stripped", t.name, prefix));
  }
  return out;
}

void strip_wrapper_prefixes(Checkpoint& checkpoint, const OpenOptions& options) {
  for (auto& tag : checkpoint.tags) {
    if (!tag.has(ViewRole::model)) continue;
    std::optional<std::string> prefix = options.strip_prefix;
    if (!prefix) {
      const auto found = layout_in(config_files(options, tag.dir, checkpoint.root));
      const auto* layout = std::get_if<HfLayout>(&found);
      if (layout == nullptr) continue;
      std::vector<std::string> names;
      for (const auto& t : tag.catalog(ViewRole::model)->tensors) names.push_back(t.name);
      prefix = layout_prefix(names, *layout);
    }
    if (!prefix || prefix->empty()) continue;
    for (auto& [folder, roles] : tag.models)
      for (auto& [role, catalog] : roles)
        if (role != ViewRole::hf) catalog = strip_prefix(*catalog, *prefix);
    tag.notes.push_back(fmt::format("stripped the wrapper prefix '{}' from the model's names{}", *prefix,
                                    options.strip_prefix ? " (-o strip_prefix)" : " (config.json's architecture)"));
  }
}

}  // namespace ckptfs::formats
