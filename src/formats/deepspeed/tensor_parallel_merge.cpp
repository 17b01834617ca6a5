#include "formats/deepspeed/tensor_parallel_merge.hpp"

#include <fmt/format.h>

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
    if (item.is_dict()) {  // parameter_with_sub_params: {'patterns': [...], 'shape': ..., 'partition_dim': ...}
      auto nested = read_patterns(item["patterns"]);
      out.text.insert(out.text.end(), nested.text.begin(), nested.text.end());
      out.compiled.insert(out.compiled.end(), nested.compiled.begin(), nested.compiled.end());
      continue;
    }
    std::string text = item.as_string();
    try {
      out.compiled.emplace_back(text, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      item.fail(fmt::format("pattern '{}' does not compile: {}", text, e.what()));
    }
    out.text.push_back(std::move(text));
  }
  return out;
}

std::shared_ptr<pickle::Value> int_value(int64_t v) {
  auto out = pickle::make_value(pickle::Kind::Int);
  out->integer = v;
  return out;
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
    for (const auto& [role, first] : ranks_.front().tag.catalogs) {
      auto merged = std::make_shared<Catalog>();
      std::vector<std::unordered_map<std::string, size_t>> index(ranks_.size());
      for (size_t r = 0; r < ranks_.size(); ++r) {
        const auto& c = ranks_[r].tag.catalog(role);
        for (size_t i = 0; i < c->tensors.size(); ++i) index[r].emplace(c->tensors[i].name, i);
      }
      for (const auto& t : first->tensors) {
        std::vector<formats::RankTensor> slices;
        for (size_t r = 0; r < ranks_.size(); ++r) {
          const auto& c = ranks_[r].tag.catalog(role);
          auto it = index[r].find(t.name);
          if (it == index[r].end())
            throw FormatError(fmt::format("{}: TP rank {} has no {} tensor {} (TP rank 0 has it)",
                                          ranks_[r].tag.dir.string(), r, role, t.name));
          slices.push_back(formats::rank_tensor(member(c, it->second), rank_file(r)));
        }
        const Split split = split_of(t.name);
        if (split == Split::Replicated)
          if (auto r = formats::differing_replica(t.name, slices))
            out.notes.push_back(fmt::format("{} {} is replicated over TP ranks but differs on TP rank {}: rank 0's copy "
                                            "is served",
                                            role, t.name, *r));
        merged->tensors.push_back(formats::merge_tensor_parallel(t.name, split, slices, t.dtype));
      }
      out.catalogs[role] = std::move(merged);
    }
  }

  // The universal plan of the merged tag: the ranks' parameters and state with the merged tensors, and
  // the keys ds_to_universal records for each.
  std::shared_ptr<const UniversalPlan> merge_universal(Tag& out) {
    const auto& first = ranks_.front().tag.universal;
    if (!first) return nullptr;
    auto plan = std::make_shared<UniversalPlan>(*first);
    plan->model_state_files.clear();
    for (const auto& r : ranks_) {
      if (!r.tag.universal) return nullptr;
      for (const auto& f : r.tag.universal->model_state_files) plan->model_state_files.push_back(f);
    }
    auto trimmed = std::make_shared<Catalog>();  // vocabulary tensors without their padding rows
    trimmed->tensors.reserve(plan->params.size() * (1 + plan->state_keys.size()));
    const auto fp32 = out.catalog("fp32");
    std::vector<CatalogPtr> states;
    for (const auto& key : plan->state_keys) states.push_back(out.catalog(key));
    const auto find = [](const CatalogPtr& c, const std::string& name) -> const LogicalTensor* {
      for (const auto& t : c->tensors)
        if (t.name == name) return &t;
      return nullptr;
    };
    std::unordered_map<std::string, size_t> fp32_index;
    for (size_t i = 0; i < fp32->tensors.size(); ++i) fp32_index.emplace(fp32->tensors[i].name, i);
    for (auto& p : plan->params) {
      const Split split = split_of(p.name);
      std::vector<std::pair<std::string, pickle::ValuePtr>> keys;
      if (split != Split::Replicated) keys.emplace_back("cat_dim", int_value(split == Split::Columns ? 1 : 0));
      if (split == Split::GatedRows) keys.emplace_back("param_n_sub_params", int_value(2));
      const bool vocab = info_.vocabulary.matches(p.name);
      if (vocab) {
        if (!info_.original_vocab_size)
          throw FormatError(fmt::format("{}: universal_checkpoint_info names vocabulary parameters but has no "
                                        "original_vocab_size",
                                        info_.file.string()));
        auto yes = pickle::make_value(pickle::Kind::Bool);
        yes->boolean = true;
        keys.emplace_back("vocab_tensor", std::move(yes));
      }
      p.merge_keys = std::move(keys);
      const auto pick = [&](const LogicalTensor* merged) -> const LogicalTensor* {
        if (merged == nullptr || !vocab) return merged;
        std::vector<catalog::Box> boxes;
        const int64_t rows = std::min(merged->shape.at(0), *info_.original_vocab_size);
        catalog::append_slice(boxes, *merged, 0, 0, rows, 0);
        std::vector<int64_t> shape = merged->shape;
        shape[0] = rows;
        trimmed->tensors.push_back(
            catalog::assembled_tensor(merged->name, merged->dtype, std::move(shape), std::move(boxes), "vocabulary rows"));
        return &trimmed->tensors.back();
      };
      auto it = fp32_index.find(p.name);
      p.fp32 = pick(it == fp32_index.end() ? nullptr : &fp32->tensors[it->second]);
      for (size_t k = 0; k < states.size(); ++k) p.state[k] = pick(find(states[k], p.name));
      if (p.fp32 == nullptr || std::find(p.state.begin(), p.state.end(), nullptr) != p.state.end())
        throw FormatError(fmt::format("{}: parameter {} has no merged fp32 master or optimizer state",
                                      out.dir.string(), p.name));
    }
    plan->keep_alive = {fp32, trimmed};
    for (const auto& c : states) plan->keep_alive.push_back(c);
    for (const auto& c : first->keep_alive) plan->keep_alive.push_back(c);  // the optimizer state's tensors
    return plan;
  }

 private:
  Split split_of(const std::string& name) const {
    return ranks_.front().buffers.contains(name) ? Split::Replicated : info_.split_of(name);
  }
  fs::path rank_file(size_t r) const {
    const auto& files = ranks_[r].tag.universal ? ranks_[r].tag.universal->model_state_files : std::vector<fs::path>{};
    return files.empty() ? ranks_[r].tag.dir : files.front();
  }

  const std::vector<RankTag>& ranks_;
  const UniversalInfo& info_;
};

}  // namespace

bool UniversalInfo::Patterns::matches(const std::string& name) const {
  for (const auto& re : compiled)
    if (std::regex_search(name, re, std::regex_constants::match_continuous)) return true;
  return false;
}

Split UniversalInfo::split_of(const std::string& name) const {
  if (replicated.matches(name)) return Split::Replicated;
  if (average.matches(name))
    throw UnsupportedError(fmt::format("{}: parameter {} is averaged over TP ranks (parameter_to_average_patterns), "
                                       "which ckptfs cannot serve without computing it",
                                       file.string(), name));
  if (two_sub_params.matches(name)) return Split::GatedRows;
  if (sub_params.matches(name))
    throw UnsupportedError(fmt::format("{}: parameter {} is fused from sub-parameters (parameter_with_sub_params), "
                                       "which ckptfs does not merge yet",
                                       file.string(), name));
  if (row_parallel.matches(name)) return Split::Columns;
  return Split::Rows;
}

UniversalInfo read_universal_info(io::FileSet& files, const fs::path& model_states) {
  const auto archive = torch::TorchArchive::open(files.open(model_states));
  const formats::Field info = formats::root_field(archive)["universal_checkpoint_info"];
  if (!info.is_dict())
    throw UnsupportedError(fmt::format("{}: a tensor-parallel checkpoint without universal_checkpoint_info: nothing "
                                       "says how each parameter is split over the TP ranks",
                                       model_states.string()));
  UniversalInfo out;
  out.file = model_states;
  out.replicated = read_patterns(info["tp_replicated_parameter_patterns"]);
  out.average = read_patterns(info["parameter_to_average_patterns"]);
  out.row_parallel = read_patterns(info["parameter_with_row_parallelism_patterns"]);
  out.two_sub_params = read_patterns(info["parameter_with_2_sub_params_cat_dim_0"]);
  out.sub_params = read_patterns(info["parameter_with_sub_params"]);
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
  out.files = first.files;
  out.notes = first.notes;
  Merger merger(ranks, info);
  merger.merge_catalogs(out);
  out.universal = merger.merge_universal(out);
  return out;
}

}  // namespace ckptfs::deepspeed
