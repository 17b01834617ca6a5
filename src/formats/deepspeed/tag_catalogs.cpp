#include "formats/deepspeed/tag_catalogs.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/partition_assembly.hpp"

namespace ckptfs::deepspeed {

using catalog::Catalog;
using catalog::LogicalTensor;
namespace fs = std::filesystem;

namespace {

LogicalTensor with_dtype(LogicalTensor t, DType dtype) {
  t.dtype = dtype;
  return t;
}

const LogicalTensor* find_in(const std::vector<LogicalTensor>& tensors,
                             const std::unordered_map<std::string, size_t>& index, const std::string& name) {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

void add_aliases(std::vector<LogicalTensor>& out,
                 const std::vector<std::pair<std::string, std::string>>& aliases,
                 std::vector<std::string>& notes) {
  auto index = index_by_name(out);
  for (const auto& [alias, owner] : aliases) {
    if (index.count(alias)) continue;
    const LogicalTensor* source = find_in(out, index, owner);
    if (source == nullptr) {
      notes.push_back(fmt::format("tied parameter {} names {}, which has no data; left out", alias, owner));
      continue;
    }
    LogicalTensor copy = *source;
    copy.name = alias;
    copy.origin = fmt::format("tied to {}", owner);
    index.emplace(alias, out.size());
    out.push_back(std::move(copy));
  }
}

LogicalTensor in_fp32_view(LogicalTensor t, std::string origin) {
  t.dtype = fp32_view_dtype(t.dtype);
  t.origin = std::move(origin);
  return t;
}

// The file a merged tensor's first elements come from (the tag dir for an empty tensor), for messages.
fs::path source_of(const LogicalTensor& t, const fs::path& dir) {
  const auto files = t.files();
  return files.empty() ? dir : files.front()->path();
}

// A view cannot hold two tensors of one name; the second comes from a file that repeats another's keys
// (a layer file copied over another, a dict pickled with a key twice).
void require_unique_names(const Catalog& c, const fs::path& dir, std::string_view which) {
  std::map<std::string_view, const LogicalTensor*> seen;
  for (const auto& t : c.tensors) {
    auto [it, inserted] = seen.emplace(t.name, &t);
    if (inserted) continue;
    throw FormatError(fmt::format("{}: tensor {} appears twice in the {} weights ({}; {})",
                                  source_of(t, dir).string(), t.name, which, it->second->origin, t.origin));
  }
}

DType training_dtype(const Catalog& model, const std::vector<LogicalTensor>& trainable) {
  const auto index = index_by_name(trainable);
  for (const auto& t : model.tensors)
    if (index.count(t.name) && dtype_is_floating(t.dtype)) return t.dtype;
  for (const auto& t : model.tensors)
    if (dtype_is_floating(t.dtype)) return t.dtype;
  return DType::F32;
}

// The universal checkpoint of the tag, and a catalog per optimizer state key in `tag`; null (with a
// note) when the tag keeps no per-parameter optimizer state.
std::shared_ptr<const UniversalPlan> universal_plan(TagParts& parts, const std::shared_ptr<Catalog>& fp32,
                                                    bool zero3, Tag& tag) {
  if (!parts.optimizer) {
    tag.notes.push_back(fmt::format("no universal/: {}", parts.no_universal.empty()
                                                             ? "no partitioned optimizer state"
                                                             : parts.no_universal));
    return nullptr;
  }
  OptimizerState& state = *parts.optimizer;
  auto plan = std::make_shared<UniversalPlan>();
  plan->bare_tensors = zero3;
  plan->state_keys = state.keys;
  plan->optimizer_state = parts.optimizer_state;
  plan->model_state_files = parts.model_state_copies;
  std::vector<std::shared_ptr<Catalog>> by_key(state.keys.size());
  for (size_t k = 0; k < state.keys.size(); ++k) {
    by_key[k] = std::make_shared<Catalog>();
    for (auto& per_param : state.tensors) by_key[k]->tensors.push_back(std::move(per_param[k]));
  }
  const auto masters = index_by_name(fp32->tensors);
  for (size_t p = 0; p < parts.trainable.size(); ++p) {
    UniversalParam param;
    param.name = parts.trainable[p].name;
    if (auto it = masters.find(param.name); it != masters.end()) param.fp32 = {fp32, it->second};
    for (const auto& c : by_key) param.state.push_back({c, p});
    param.step = state.steps[p];
    plan->params.push_back(std::move(param));
  }
  for (size_t k = 0; k < state.keys.size(); ++k) tag.states.emplace(state.keys[k], std::move(by_key[k]));
  return plan;
}

}  // namespace

std::unordered_map<std::string, size_t> index_by_name(const std::vector<LogicalTensor>& tensors) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);
  return index;
}

std::vector<LogicalTensor> module_tensors(const TagParts& parts) {
  std::vector<LogicalTensor> out;
  for (const auto& e : parts.module) out.push_back(whole_tensor(e.name, e.tensor, e.tensor.dtype, "module"));
  return out;
}

Catalog build_fp32_catalog(const TagParts& parts, const std::vector<LogicalTensor>& module,
                           std::vector<std::string>& notes) {
  Catalog c;
  std::set<std::string> trainable_names, alias_names;
  for (const auto& t : parts.trainable) trainable_names.insert(t.name);
  for (const auto& [alias, owner] : parts.aliases) alias_names.insert(alias);

  if (!parts.masters_known) {
    for (const auto& t : module) c.tensors.push_back(in_fp32_view(t, "module, upcast"));
    return c;
  }
  for (const auto& t : module)
    if (parts.buffers.count(t.name)) c.tensors.push_back(in_fp32_view(t, "buffer"));
  if (parts.frozen_from_module) {
    for (const auto& t : module)
      if (!parts.buffers.count(t.name) && !trainable_names.count(t.name) && !alias_names.count(t.name))
        c.tensors.push_back(in_fp32_view(t, "frozen, from module"));
  } else {
    for (const auto& t : parts.frozen) c.tensors.push_back(with_dtype(t, fp32_view_dtype(t.dtype)));
  }
  for (const auto& t : parts.trainable) c.tensors.push_back(t);
  add_aliases(c.tensors, parts.aliases, notes);
  return c;
}

Catalog build_model_catalog(const TagParts& parts, bool zero3, std::vector<std::string>& notes) {
  Catalog c;
  if (parts.model_from_masters) {
    for (const auto& t : parts.trainable) c.tensors.push_back(with_dtype(t, *parts.model_from_masters));
    add_aliases(c.tensors, parts.aliases, notes);
    return c;
  }
  if (!zero3) {
    c.tensors = module_tensors(parts);
    return c;
  }
  std::map<std::string, std::string> owner_of(parts.aliases.begin(), parts.aliases.end());
  const auto trainable = index_by_name(parts.trainable), frozen = index_by_name(parts.frozen);
  for (const auto& e : parts.module) {
    if (parts.buffers.count(e.name)) {
      c.tensors.push_back(whole_tensor(e.name, e.tensor, e.tensor.dtype, "buffer"));
      continue;
    }
    const std::string& source_name = owner_of.count(e.name) ? owner_of[e.name] : e.name;
    const LogicalTensor* source = find_in(parts.trainable, trainable, source_name);
    if (source == nullptr) source = find_in(parts.frozen, frozen, source_name);
    if (source == nullptr) {
      notes.push_back(
          fmt::format("{} is a ZeRO-3 placeholder without partitions in the tag; left out", e.name));
      continue;
    }
    LogicalTensor t = with_dtype(*source, e.tensor.dtype);
    t.name = e.name;
    if (source_name != e.name) t.origin = fmt::format("tied to {}", source_name);
    c.tensors.push_back(std::move(t));
  }
  return c;
}

void add_master_files(Tag& tag, const TagParts& parts) {
  for (const auto& t : parts.trainable)
    for (const auto& f : t.files()) tag.files.push_back(f->path());
}

// The buffers and tied aliases the model states name (buffer_names, shared_params) marked in `c`.
void mark_model_roles(Catalog& c, const TagParts& parts) {
  std::set<std::string> aliases;
  for (const auto& [alias, owner] : parts.aliases) aliases.insert(alias);
  for (auto& t : c.tensors)
    t.role = parts.buffers.contains(t.name) ? catalog::ModelRole::buffer
             : aliases.contains(t.name)     ? catalog::ModelRole::tied_alias
                                            : catalog::ModelRole::parameter;
}

void finish_tag(Tag& tag, TagParts& parts, std::shared_ptr<Catalog> fp32, CatalogPtr model, bool zero3) {
  const fs::path& dir = tag.dir;
  mark_model_roles(*fp32, parts);
  auto marked = std::make_shared<Catalog>(*model);
  mark_model_roles(*marked, parts);
  model = std::move(marked);
  require_unique_names(*fp32, dir, "fp32");
  require_unique_names(*model, dir, "model");
  for (const catalog::Catalog* c : {static_cast<const catalog::Catalog*>(fp32.get()), model.get()}) {
    for (const auto& t : c->tensors) {
      try {
        catalog::validate(t);
      } catch (const FormatError& e) {
        throw FormatError(fmt::format("{}: {}", source_of(t, dir).string(), e.what()));
      }
    }
  }
  tag.topology.train_dtype = training_dtype(*model, parts.trainable);
  tag.deepspeed.value().universal = universal_plan(parts, fp32, zero3, tag);
  tag.add(ViewRole::fp32, std::move(fp32));
  tag.add(ViewRole::model, std::move(model));
}

}  // namespace ckptfs::deepspeed
