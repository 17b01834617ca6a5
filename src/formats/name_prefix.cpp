#include "formats/name_prefix.hpp"

#include <fmt/format.h>

#include <map>
#include <set>

#include "ckptfs/error.hpp"

namespace ckptfs::formats {

std::optional<std::string> layout_prefix(const std::vector<std::string>& names, const HfLayout& layout) {
  std::set<std::string, std::less<>> own;  // the layout's parameter names and module paths
  for (const auto& p : layout.parameters)
    for (size_t dot = p.name.find('.');; dot = p.name.find('.', dot + 1)) {
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
      throw FormatError(
          fmt::format("{}: two tensors are named so once the prefix '{}' is stripped", t.name, prefix));
  }
  return out;
}

void strip_wrapper_prefixes(const io::Source& source, Checkpoint& checkpoint, const OpenOptions& options) {
  for (auto& tag : checkpoint.tags) {
    std::optional<HfLayout> layout;  // read only where needed: a tag without -o strip_prefix
    bool layout_read = false;
    // each model folder on its own (accelerate's second model need not carry the first one's wrapper)
    for (auto& [folder, roles] : tag.models) {
      const auto model = roles.find(ViewRole::model);
      if (model == roles.end()) continue;
      std::optional<std::string> prefix = options.strip_prefix;
      if (!prefix) {
        if (!layout_read) {
          auto found = layout_in(source, config_files(options, tag.dir, checkpoint.root));
          if (auto* l = std::get_if<HfLayout>(&found)) layout = std::move(*l);
          layout_read = true;
        }
        if (!layout) break;
        std::vector<std::string> names;
        for (const auto& t : model->second->tensors) names.push_back(t.name);
        prefix = layout_prefix(names, *layout);
      }
      if (!prefix || prefix->empty()) continue;
      for (auto& [role, catalog] : roles)
        if (role != ViewRole::hf) catalog = strip_prefix(*catalog, *prefix);
      tag.notes.push_back(
          fmt::format("stripped the wrapper prefix '{}' from the {}model's names{}", *prefix,
                      folder.empty() ? "" : folder + "/ ",
                      options.strip_prefix ? " (-o strip_prefix)" : " (config.json's architecture)"));
    }
  }
}

}  // namespace ckptfs::formats
