#include "formats/deepspeed/tensor_parallel_merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "ckptfs/error.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::deepspeed {

namespace fs = std::filesystem;
using catalog::Catalog;
using catalog::LogicalTensor;
using formats::Split;

namespace {

UniversalInfo::Patterns read_patterns(const formats::Field& list) {
  UniversalInfo::Patterns out;
  if (!list.present()) return out;
  if (!list.is_list()) list.fail("expected a list of patterns");
  for (size_t i = 0; i < list.size(); ++i) {
    const formats::Field item = list.at(i);
    const std::string text = item.as_string();
    std::string error;
    NamePattern pattern = NamePattern::compile(text, &error);
    if (!pattern.ok()) item.fail(fmt::format("pattern '{}' is not supported: {}", text, error));
    out.list.push_back(std::move(pattern));
  }
  return out;
}

std::shared_ptr<pickle::Value> int_value(int64_t v) {
  auto out = pickle::make_value(pickle::Kind::Int);
  out->integer = v;
  return out;
}

std::vector<int64_t> int_list(const formats::Field& f) {
  std::vector<int64_t> out;
  if (!f.is_list()) f.fail("expected a list of sizes");
  for (size_t i = 0; i < f.size(); ++i) out.push_back(f.at(i).as_int());
  return out;
}

// The layout ds_to_universal reconstructs: version 0.4 records the sizes (a tuple at partition_dim) and
// every rank's widths; older versions a count of equal sub-parameters (or their sizes), split evenly.
formats::SubParams sub_layout(const UniversalInfo& info, const UniversalInfo::SubParams& sp,
                              const std::string& pattern, const std::string& name,
                              const std::vector<formats::RankTensor>& ranks) {
  const formats::Field entry(sp.entry.get(), &info.file,
                             "universal_checkpoint_info.parameter_with_sub_params");
  const auto fail = [&](const std::string& what) -> void {
    throw FormatError(fmt::format("{}: parameter {}: {}", info.file.string(), name, what));
  };
  formats::SubParams out;
  if (sp.partition_dim < 0) fail("negative partition_dim");
  out.dim = static_cast<size_t>(sp.partition_dim);
  for (const auto& r : ranks)
    if (r.tensor.shape.size() <= out.dim) fail("partition_dim past the tensor's dimensions");
  const formats::Field spec = entry["shape"].at(out.dim);
  const size_t tp = ranks.size();
  if (info.version >= 0.4) {
    out.sizes = int_list(spec);
    auto it = info.shard_widths.find(pattern);
    if (it == info.shard_widths.end())
      fail("universal checkpoint version 0.4 without sub_param_shard_widths for it");
    out.widths = it->second;
  } else {
    if (spec.is_list()) {
      out.sizes = int_list(spec);
    } else {
      const int64_t count = spec.as_int();
      int64_t full = 0;
      for (const auto& r : ranks) full += r.tensor.shape[out.dim];
      // More sub-parameters than elements cannot be (and would ask for that many sizes).
      if (count <= 0 || count > full || full % count != 0)
        fail(fmt::format("{} sub-parameters do not divide {}", count, full));
      out.sizes.assign(static_cast<size_t>(count), full / count);
    }
    for (int64_t size : out.sizes) {
      if (size % static_cast<int64_t>(tp) != 0)
        fail(fmt::format("a sub-parameter of {} does not split evenly over TP {}", size, tp));
      out.widths.emplace_back(tp, size / static_cast<int64_t>(tp));
    }
  }
  if (out.widths.size() != out.sizes.size()) fail("shard widths and sub-parameter sizes differ in number");
  // Every width and size at most the tensor's extent (so that no sum below overflows) and none negative:
  // the sums alone would let [-2, 6] pass for a width of 4.
  int64_t extent = 0;
  for (const auto& r : ranks) extent += r.tensor.shape[out.dim];
  const auto check_extent = [&](int64_t n, const char* what) {
    if (n < 0 || n > extent)
      fail(fmt::format("a {} of {} (the tensor has {} along dim {})", what, n, extent, out.dim));
  };
  for (size_t s = 0; s < out.sizes.size(); ++s) {
    check_extent(out.sizes[s], "sub-parameter size");
    int64_t sum = 0;
    if (out.widths[s].size() != tp) fail("shard widths for a different TP size");
    for (int64_t w : out.widths[s]) {
      check_extent(w, "shard width");
      sum += w;
    }
    if (sum != out.sizes[s])
      fail(fmt::format("shard widths sum to {}, the sub-parameter has {}", sum, out.sizes[s]));
  }
  for (size_t r = 0; r < tp; ++r) {
    int64_t held = 0;
    for (const auto& w : out.widths) held += w[r];
    if (held != ranks[r].tensor.shape[out.dim])
      fail(fmt::format("TP rank {} holds {} along dim {}, its shard widths add up to {}", r,
                       ranks[r].tensor.shape[out.dim], out.dim, held));
  }
  return out;
}

// The SubparamShape object ds_to_universal stores under 'sub_param_shape' (a dataclass: NEWOBJ + BUILD).
pickle::ValuePtr subparam_shape_value(const std::shared_ptr<const pickle::Value>& entry) {
  auto state = pickle::make_value(pickle::Kind::Dict);
  for (const char* key : {"patterns", "shape", "partition_dim"}) {
    auto k = pickle::make_value(pickle::Kind::String);
    k->text = key;
    const pickle::Value* v = entry->find(key);
    state->entries.emplace_back(
        k, v ? std::make_shared<pickle::Value>(*v) : pickle::make_value(pickle::Kind::None));
  }
  auto obj = pickle::make_value(pickle::Kind::Object);
  obj->module = "deepspeed.checkpoint.universal_checkpoint";
  obj->name = "SubparamShape";
  obj->made_by_new = true;
  obj->args = pickle::make_value(pickle::Kind::Tuple);
  obj->state = std::move(state);
  return obj;
}

// A tensor of `catalog` kept alive by the catalog itself.
std::shared_ptr<const LogicalTensor> member(const CatalogPtr& catalog, size_t index) {
  return std::shared_ptr<const LogicalTensor>(catalog, &catalog->tensors[index]);
}

class Merger {
 public:
  Merger(const std::vector<RankTag>& ranks, const UniversalInfo& info) : ranks_(ranks), info_(info) {}

  // Every catalog of the ranks, merged name by name.
  void merge_catalogs(Tag& out) {
    for (const auto& [folder, roles] : ranks_.front().tag.models)
      for (const auto& [role, first] : roles) {
        const auto of_rank = [&, role = role, folder = folder](size_t r) {
          return ranks_[r].tag.catalog(role, folder);
        };
        out.models[folder][role] = merge_catalog(std::string(role_name(role)), of_rank, out);
      }
    for (const auto& [state, first] : ranks_.front().tag.states) {
      const auto of_rank = [&, state = state](size_t r) { return ranks_[r].tag.states.at(state); };
      out.states[state] = merge_catalog(state, of_rank, out);
    }
  }

  // The catalog `role` of every rank (of_rank(r)) merged name by name.
  CatalogPtr merge_catalog(const std::string& role, const std::function<CatalogPtr(size_t)>& of_rank,
                           Tag& out) {
    const CatalogPtr first = of_rank(0);
    auto merged = std::make_shared<Catalog>();
    std::vector<std::unordered_map<std::string, size_t>> index(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const auto c = of_rank(r);
      for (size_t i = 0; i < c->tensors.size(); ++i) index[r].emplace(c->tensors[i].name, i);
    }
    for (const auto& t : first->tensors) {
      std::vector<formats::RankTensor> slices;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        const auto c = of_rank(r);
        auto it = index[r].find(t.name);
        if (it == index[r].end())
          throw FormatError(fmt::format("{}: TP rank {} has no {} tensor {} (TP rank 0 has it)",
                                        ranks_[r].tag.dir.string(), r, role, t.name));
        slices.push_back(formats::rank_tensor(member(c, it->second), rank_file(r)));
      }
      std::string pattern;
      const auto* sp = info_.sub_params_of(t.name, &pattern);
      const formats::TensorParallelRule rule =
          sp ? formats::TensorParallelRule(sub_layout(info_, *sp, pattern, t.name, slices))
             : split_of(t.name);
      LogicalTensor whole = formats::merge_tensor_parallel(t.name, rule, slices, t.dtype, &out.notes,
                                                           fmt::format("{} {}", role, t.name));
      whole.role = t.role;  // as TP rank 0's model states name it
      merged->tensors.push_back(std::move(whole));
    }
    return merged;
  }

  // The universal plan of the merged tag: the ranks' parameters and state with the merged tensors, and
  // the keys ds_to_universal records for each.
  std::shared_ptr<const UniversalPlan> merge_universal(Tag& out) {
    const auto first = ranks_.front().tag.universal();
    if (!first) return nullptr;
    auto plan = std::make_shared<UniversalPlan>(*first);
    plan->model_state_files.clear();
    for (const auto& r : ranks_) {
      const auto rank_plan = r.tag.universal();
      if (!rank_plan) return nullptr;
      for (const auto& f : rank_plan->model_state_files) plan->model_state_files.push_back(f);
    }
    auto trimmed = std::make_shared<Catalog>();  // vocabulary tensors without their padding rows
    const auto fp32 = out.catalog(ViewRole::fp32);
    std::vector<CatalogPtr> states;
    for (const auto& key : plan->state_keys) states.push_back(out.states.at(key));
    // Tensors by name per catalog: a lookup per parameter, not a scan.
    const auto index_of = [](const CatalogPtr& c) {
      std::unordered_map<std::string_view, size_t> index;
      for (size_t i = 0; i < c->tensors.size(); ++i) index.emplace(c->tensors[i].name, i);
      return index;
    };
    const auto find = [](const CatalogPtr& c, const auto& index,
                         const std::string& name) -> catalog::TensorRef {
      auto it = index.find(name);
      return it == index.end() ? catalog::TensorRef{} : catalog::TensorRef{c, it->second};
    };
    const auto fp32_index = index_of(fp32);
    std::vector<std::unordered_map<std::string_view, size_t>> state_index;
    for (const auto& c : states) state_index.push_back(index_of(c));
    for (auto& p : plan->params) {
      std::vector<std::pair<std::string, pickle::ValuePtr>> keys;
      std::string pattern;
      if (const auto* sp = info_.sub_params_of(p.name, &pattern)) {
        if (info_.version < 0.4) {
          out.notes.push_back(
              fmt::format("no universal/: {} fuses sub-parameters and the checkpoint's universal "
                          "info is version {} (ckptfs writes their files for 0.4)",
                          p.name, info_.version));
          return nullptr;
        }
        keys.emplace_back("sub_param_shape", subparam_shape_value(sp->entry));
      } else {
        const Split split = split_of(p.name);
        if (split != Split::Replicated)
          keys.emplace_back("cat_dim", int_value(split == Split::Columns ? 1 : 0));
        if (split == Split::GatedRows) keys.emplace_back("param_n_sub_params", int_value(2));
      }
      const bool vocab = info_.vocabulary.matches(p.name);
      if (vocab) {
        if (!info_.original_vocab_size)
          throw FormatError(
              fmt::format("{}: universal_checkpoint_info names vocabulary parameters but has no "
                          "original_vocab_size",
                          info_.file.string()));
        auto yes = pickle::make_value(pickle::Kind::Bool);
        yes->boolean = true;
        keys.emplace_back("vocab_tensor", std::move(yes));
      }
      p.merge_keys = std::move(keys);
      const auto pick = [&](const catalog::TensorRef& merged) -> catalog::TensorRef {
        if (!merged || !vocab) return merged;
        std::vector<catalog::Box> boxes;
        const int64_t rows = std::min(merged->shape.at(0), *info_.original_vocab_size);
        catalog::append_slice(boxes, *merged, 0, 0, rows, 0);
        std::vector<int64_t> shape = merged->shape;
        shape[0] = rows;
        trimmed->tensors.push_back(catalog::assembled_tensor(merged->name, merged->dtype, std::move(shape),
                                                             std::move(boxes), "vocabulary rows"));
        return {trimmed, trimmed->tensors.size() - 1};
      };
      p.fp32 = pick(find(fp32, fp32_index, p.name));
      for (size_t k = 0; k < states.size(); ++k) p.state[k] = pick(find(states[k], state_index[k], p.name));
      if (!p.fp32 || std::any_of(p.state.begin(), p.state.end(), [](const auto& s) { return !s; }))
        throw FormatError(fmt::format("{}: parameter {} has no merged fp32 master or optimizer state",
                                      out.dir.string(), p.name));
    }
    return plan;
  }

 private:
  Split split_of(const std::string& name) const {
    return ranks_.front().buffers.contains(name) ? Split::Replicated : info_.split_of(name);
  }
  fs::path rank_file(size_t r) const {
    const auto plan = ranks_[r].tag.universal();
    return !plan || plan->model_state_files.empty() ? ranks_[r].tag.dir : plan->model_state_files.front();
  }

  const std::vector<RankTag>& ranks_;
  const UniversalInfo& info_;
};

}  // namespace

const UniversalInfo::SubParams* UniversalInfo::sub_params_of(const std::string& name,
                                                             std::string* pattern) const {
  for (const auto& sp : sub_params)
    if (const NamePattern* hit = sp.patterns.first_match(name)) {
      *pattern = hit->text();
      return &sp;
    }
  return nullptr;
}

const NamePattern* UniversalInfo::Patterns::first_match(const std::string& name) const {
  for (const auto& p : list)
    if (p.matches(name)) return &p;
  return nullptr;
}

Split UniversalInfo::split_of(const std::string& name) const {
  if (replicated.matches(name)) return Split::Replicated;
  if (average.matches(name))
    throw UnsupportedError(
        fmt::format("{}: parameter {} is averaged over TP ranks (parameter_to_average_patterns), "
                    "which ckptfs cannot serve without computing it",
                    file.string(), name));
  if (two_sub_params.matches(name)) return Split::GatedRows;
  if (row_parallel.matches(name)) return Split::Columns;
  return Split::Rows;
}

UniversalInfo read_universal_info(io::FileSet& files, const fs::path& model_states) {
  return read_universal_info(torch::TorchArchive::open(files.open(model_states)).root(), model_states);
}

UniversalInfo read_universal_info(const pickle::ValuePtr& root, const fs::path& model_states) {
  const formats::Field info = formats::Field(root.get(), &model_states, "")["universal_checkpoint_info"];
  if (!info.is_dict())
    throw UnsupportedError(
        fmt::format("{}: a tensor-parallel checkpoint without universal_checkpoint_info: nothing "
                    "says how each parameter is split over the TP ranks",
                    model_states.string()));
  UniversalInfo out;
  out.file = model_states;
  out.replicated = read_patterns(info["tp_replicated_parameter_patterns"]);
  out.average = read_patterns(info["parameter_to_average_patterns"]);
  out.row_parallel = read_patterns(info["parameter_with_row_parallelism_patterns"]);
  out.two_sub_params = read_patterns(info["parameter_with_2_sub_params_cat_dim_0"]);
  if (const formats::Field list = info["parameter_with_sub_params"]; list.present()) {
    if (!list.is_list()) list.fail("expected a list of sub-parameter entries");
    for (size_t i = 0; i < list.size(); ++i) {
      const formats::Field e = list.at(i);
      if (!e.is_dict()) e.fail("expected {'patterns', 'shape', 'partition_dim'}");
      UniversalInfo::SubParams sp;
      sp.patterns = read_patterns(e["patterns"]);
      sp.partition_dim = e["partition_dim"].as_int();
      sp.entry = std::shared_ptr<const pickle::Value>(root, &e.value());
      out.sub_params.push_back(std::move(sp));
    }
  }
  if (const formats::Field widths = info["sub_param_shard_widths"]; widths.is_dict())
    for (const auto& [pattern, per_sub] : widths.items()) {
      auto& w = out.shard_widths[pattern];
      for (size_t s = 0; s < per_sub.size(); ++s) w.push_back(int_list(per_sub.at(s)));
    }
  if (const formats::Field v = info["universal_checkpoint_version"]; v.present())
    out.version = v.value().is(pickle::Kind::Float) ? v.value().real : static_cast<double>(v.as_int());
  out.vocabulary = read_patterns(info["vocabulary_parameter_patterns"]);
  if (const formats::Field v = info["original_vocab_size"]; v.present()) out.original_vocab_size = v.as_int();
  return out;
}

Tag merge_tensor_parallel_ranks(std::vector<RankTag> ranks, const UniversalInfo& info) {
  Tag out;
  const Tag& first = ranks.front().tag;
  out.name = first.name;
  out.dir = first.dir;
  out.format = first.format;
  out.topology = first.topology;
  out.topology.tp = static_cast<int>(ranks.size());
  out.deepspeed = first.deepspeed.value_or(DeepSpeedTag{});
  out.files = first.files;
  out.notes = first.notes;
  Merger merger(ranks, info);
  merger.merge_catalogs(out);
  out.deepspeed->universal = merger.merge_universal(out);
  return out;
}

}  // namespace ckptfs::deepspeed
