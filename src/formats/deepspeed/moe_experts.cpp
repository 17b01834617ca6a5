#include "formats/deepspeed/moe_experts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/model_state_masters.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/parallel_reads.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::deepspeed {

using catalog::LogicalTensor;
namespace fs = std::filesystem;

namespace {

// What engine._save_moe_checkpoint renames: `<module>` + this + `<expert id>.<param>`.
constexpr std::string_view kExperts = ".deepspeed_moe.experts.deepspeed_experts.";
constexpr std::string_view kExpertsTail = "experts.deepspeed_experts.";

struct ExpertName {
  std::string prefix;  // through kExperts
  int id = 0;
  std::string rest;  // after "<id>"
};

std::optional<ExpertName> split_expert_name(const std::string& name) {
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  const size_t digits = at + kExperts.size();
  ExpertName out;
  out.prefix = name.substr(0, digits);
  auto [end, ec] = std::from_chars(name.data() + digits, name.data() + name.size(), out.id);
  if (ec != std::errc{} || end == name.data() + name.size() || *end != '.') return std::nullopt;
  out.rest = std::string(end, name.data() + name.size());
  return out;
}

std::string expert_file_name(int layer, int expert) {
  return fmt::format("layer_{}_expert_{}_mp_rank_00_model_states.pt", layer, expert);
}

// Keys must be `<prefix><expert>.<param>`, one prefix per layer.
void check_expert_keys(const std::vector<NamedTensor>& entries, const fs::path& path, int expert,
                       std::string& prefix) {
  if (entries.empty()) throw FormatError(fmt::format("{}: holds no tensors", path.string()));
  for (const auto& e : entries) {
    auto name = split_expert_name(e.name);
    if (!name || name->id != expert)
      throw FormatError(fmt::format("{}: key {} is not a parameter of expert {} (<module>{}{}.<name>)",
                                    path.string(), e.name, expert, kExperts, expert));
    if (prefix.empty()) prefix = name->prefix;
    if (name->prefix != prefix)
      throw FormatError(fmt::format("{}: key {} belongs to another MoE module than {}", path.string(), e.name,
                                    prefix.substr(0, prefix.size() - kExperts.size())));
  }
}

// The optimizer state of `groups` of one rank only, renumbered 0..n-1 (the layout assemble_flat_groups
// reads).
OptimStates only_groups(const OptimStates& rank, const std::vector<size_t>& groups) {
  OptimStates out;
  out.path = rank.path;
  out.zero_stage = rank.zero_stage;
  for (size_t i = 0; i < groups.size(); ++i) {
    const size_t g = groups[i];
    if (g >= rank.fp32_groups.size())
      throw FormatError(fmt::format("{}: has no fp32 partition for group {}", rank.path.string(), g));
    out.fp32_groups.push_back(rank.fp32_groups[g]);
    out.partition_count.push_back(rank.partition_count[g]);
    if (auto it = rank.group_state.find(static_cast<int64_t>(g)); it != rank.group_state.end())
      out.group_state.emplace(static_cast<int64_t>(i), it->second);
  }
  return out;
}

// The expert data-parallel group of EP rank `ep`, in partition order (deepspeed/utils/groups.py
// _create_expert_and_data_parallel): E + D puts EP rank e on ranks e, e + ep, ...; D + E on e x edp, ...
std::vector<size_t> expert_data_parallel_ranks(int ep, int ep_size, int edp_size, bool data_before_expert) {
  std::vector<size_t> ranks;
  for (int k = 0; k < edp_size; ++k)
    ranks.push_back(static_cast<size_t>(data_before_expert ? ep * edp_size + k : ep + k * ep_size));
  return ranks;
}

// The layer an expert parameter name belongs to, by its prefix.
const MoeLayer& layer_of(const std::vector<MoeLayer>& layers, const ExpertName& name,
                         const fs::path& shapes_file, const std::string& param) {
  for (const auto& l : layers)
    if (l.experts_prefix == name.prefix) return l;
  throw FormatError(
      fmt::format("{}: param_shapes lists expert parameter {}, but no expert file holds its MoE module",
                  shapes_file.string(), param));
}

// Expert group `shapes` (local expert ids, as EP rank 0 saved them) as EP rank `ep` holds them: global ids.
std::vector<NamedShape> shapes_of_ep_rank(const std::vector<NamedShape>& shapes, int ep, int ep_size,
                                          const std::vector<MoeLayer>& layers, const fs::path& shapes_file) {
  std::vector<NamedShape> out;
  for (const auto& s : shapes) {
    auto name = split_expert_name(s.name);
    if (!name)
      throw FormatError(fmt::format("{}: {} sits in an expert parameter group but is not an expert parameter",
                                    shapes_file.string(), s.name));
    const MoeLayer& layer = layer_of(layers, *name, shapes_file, s.name);
    const int experts = static_cast<int>(layer.experts.size());
    if (experts % ep_size != 0 || name->id >= experts / ep_size)
      throw FormatError(
          fmt::format("{}: {} is local expert {} of MoE layer {}, which has {} experts over {} "
                      "expert-parallel ranks",
                      shapes_file.string(), s.name, name->id, layer.id, experts, ep_size));
    NamedShape global = s;
    global.name = fmt::format("{}{}{}", name->prefix, ep * (experts / ep_size) + name->id, name->rest);
    out.push_back(std::move(global));
  }
  return out;
}

// Masters in the order of `module` (which holds every expert): the order the model's state_dict has.
std::vector<LogicalTensor> in_module_order(std::vector<LogicalTensor> masters,
                                           const std::vector<NamedTensor>& module) {
  std::unordered_map<std::string_view, size_t> position;
  for (size_t i = 0; i < module.size(); ++i) position.emplace(module[i].name, i);
  const auto rank = [&](const LogicalTensor& t) {
    auto it = position.find(t.name);
    return it == position.end() ? module.size() : it->second;
  };
  std::stable_sort(masters.begin(), masters.end(),
                   [&](const LogicalTensor& a, const LogicalTensor& b) { return rank(a) < rank(b); });
  return masters;
}

// Every expert master must be an expert weight of the same shape.
void check_against_expert_files(const std::vector<LogicalTensor>& masters,
                                const std::vector<MoeLayer>& layers, const fs::path& shapes_file) {
  std::unordered_map<std::string_view, const NamedTensor*> weights;
  for (const auto& l : layers)
    for (const auto& expert : l.experts)
      for (const auto& e : expert) weights.emplace(e.name, &e);
  for (const auto& m : masters) {
    if (!split_expert_name(m.name)) continue;
    auto it = weights.find(m.name);
    if (it == weights.end())
      throw FormatError(fmt::format("{}: param_shapes gives expert parameter {}, which no expert file holds",
                                    shapes_file.string(), m.name));
    if (it->second->tensor.shape != m.shape)
      throw FormatError(
          fmt::format("{}: expert parameter {} has another shape in param_shapes than in its "
                      "expert file",
                      shapes_file.string(), m.name));
  }
}

// The EP size the expert param groups of a non-ZeRO optimizer state_dict are named for (moe/utils.py
// split_params_into_different_moe_groups_for_optimizer: 'name': 'ep_size_<N>').
std::optional<int> named_ep_size(const ExpertRankOptimizer& rank) {
  std::optional<int> out;
  constexpr std::string_view kName = "ep_size_";
  for (const std::string& text : rank.group_names) {
    if (!text.starts_with(kName)) continue;
    int ep = 0;
    auto [end, ec] = std::from_chars(text.data() + kName.size(), text.data() + text.size(), ep);
    if (ec != std::errc{} || end != text.data() + text.size() || ep < 1 || ep > (1 << 20))
      throw FormatError(
          fmt::format("{}: expert group name '{}' is not ep_size_<N>", rank.path.string(), text));
    out = std::max(out.value_or(1), ep);
  }
  return out;
}

// One optimizer file's param_slice_mappings: per group, the names of the params it holds a fragment of, in
// flat order (by fragment start); and its ds_config's use_data_before_expert_parallel_.
struct SliceNames {
  std::vector<std::vector<std::string>> groups;
  bool data_before_expert = false;
  bool round_robin = false;  // zero_optimization.round_robin_gradients: the mappings miss the flat order
};

bool config_flag(const formats::Field& flag) {
  return flag.present() && flag.value().is(pickle::Kind::Bool) && flag.value().boolean;
}

SliceNames read_slice_names(io::FileSet& files, const fs::path& path) {
  auto archive = torch::TorchArchive::open(files.open(path));
  const formats::Field root = formats::root_field(archive);
  const formats::Field mappings = root["optimizer_state_dict"]["param_slice_mappings"];
  if (!mappings.is_list())
    root.fail("has no optimizer_state_dict.param_slice_mappings, and the model states have no param_shapes");
  SliceNames out;
  for (size_t g = 0; g < mappings.size(); ++g) {
    std::vector<std::pair<int64_t, std::string>> by_start;
    for (const auto& [name, address] : mappings.at(g).items())
      by_start.emplace_back(address["start"].as_int(), name);
    std::stable_sort(by_start.begin(), by_start.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    auto& names = out.groups.emplace_back();
    for (auto& [start, name] : by_start) names.push_back(std::move(name));
  }
  out.data_before_expert = config_flag(root["ds_config"]["use_data_before_expert_parallel_"]);
  out.round_robin = config_flag(root["ds_config"]["zero_optimization"]["round_robin_gradients"]);
  return out;
}

}  // namespace

ModelStates with_shapes_from_slice_mappings(io::FileSet& files, const ModelStates& ms,
                                            const std::vector<OptimStates>& optim,
                                            const std::vector<NamedTensor>& module) {
  std::vector<fs::path> paths;
  for (const auto& r : optim) paths.push_back(r.path);
  const auto names = formats::read_all(paths, [&](const fs::path& p) { return read_slice_names(files, p); });
  std::unordered_map<std::string_view, const NamedTensor*> by_name;
  for (const auto& e : module) by_name.emplace(e.name, &e);
  // param_slice_mappings keep the params' original order, the flat buffers a round-robin one.
  if (names.front().round_robin)
    throw UnsupportedError(
        fmt::format("{}: no param_shapes, and with round_robin_gradients the optimizer files' "
                    "param_slice_mappings do not give the flat order",
                    ms.path.string()));
  ModelStates out = ms;
  out.data_before_expert_parallel = names.front().data_before_expert;
  out.param_shapes.emplace();
  const OptimStates& first = optim.front();
  const int world = static_cast<int>(optim.size());
  for (size_t g = 0; g < first.fp32_groups.size(); ++g) {
    // The ranks whose partitions, in order, make up the group's flat buffer (EP rank 0's for an expert
    // group).
    std::vector<size_t> ranks;
    const bool expert = g < first.expert_groups.size() && first.expert_groups[g];
    if (expert) {
      const int64_t edp = first.partition_count[g];
      if (edp < 1 || world % edp != 0)
        throw FormatError(
            fmt::format("{}: expert group {} is partitioned over {} ranks, which does not divide the {} "
                        "data-parallel ranks",
                        first.path.string(), g, edp, world));
      ranks = expert_data_parallel_ranks(0, world / static_cast<int>(edp), static_cast<int>(edp),
                                         out.data_before_expert_parallel);
    } else {
      for (int r = 0; r < world; ++r) ranks.push_back(static_cast<size_t>(r));
    }
    auto& shapes = out.param_shapes->emplace_back();
    for (size_t r : ranks) {
      if (names[r].groups.size() <= g)
        throw FormatError(fmt::format("{}: param_slice_mappings has no group {}", optim[r].path.string(), g));
      for (const auto& name : names[r].groups[g]) {
        if (!shapes.empty() && shapes.back().name == name) continue;  // a param spanning two partitions
        auto it = by_name.find(name);
        if (it == by_name.end())
          throw FormatError(
              fmt::format("{}: param_slice_mappings names {}, which neither module nor an expert file "
                          "holds",
                          optim[r].path.string(), name));
        shapes.push_back({name, it->second->tensor.shape, it->second->tensor.numel()});
      }
    }
  }
  return out;
}

void require_supported_moe(const TagFiles& tf, bool universal_dir) {
  if (!tf.unsupported_expert_files.empty())
    throw UnsupportedError(fmt::format(
        "{}: legacy (expert_<id>) or tensor-parallel Mixture-of-Experts files are not supported yet",
        tf.unsupported_expert_files.front().string()));
  if (tf.expert_states.empty()) {
    if (!tf.expert_optim_states.empty())
      throw FormatError(
          fmt::format("{}: a Mixture-of-Experts optimizer file, but the tag has no "
                      "layer_<L>_expert_<E>_mp_rank_00_model_states.pt files",
                      tf.expert_optim_states.begin()->second.string()));
    return;
  }
  const fs::path& first = tf.expert_states.begin()->second.begin()->second;
  if (!tf.zero3_model_states.empty() || !tf.layer_states.empty() || tf.model_states.size() > 1 ||
      universal_dir)
    throw UnsupportedError(fmt::format(
        "{}: Mixture-of-Experts checkpoints with ZeRO-3, pipeline or tensor parallelism, or as universal "
        "checkpoints, are not supported yet",
        first.string()));
}

std::vector<MoeLayer> read_moe_layers(io::FileSet& files, const TagFiles& tf, const ModelStates& ms) {
  const fs::path dir = ms.path.parent_path();
  std::vector<MoeLayer> layers;
  for (const auto& [id, experts] : tf.expert_states) {
    const int expected_layer = static_cast<int>(layers.size());
    if (id != expected_layer)
      throw FormatError(fmt::format("{}: missing (MoE layer files are numbered from 0; the next is layer {})",
                                    (dir / expert_file_name(expected_layer, 0)).string(), id));
    std::vector<fs::path> paths;
    for (const auto& [expert, path] : experts) {
      const int expected = static_cast<int>(paths.size());
      if (expert != expected)
        throw FormatError(
            fmt::format("{}: missing (the experts of MoE layer {} are numbered from 0; found {})",
                        (dir / expert_file_name(id, expected)).string(), id, path.filename().string()));
      paths.push_back(path);
    }
    if (ms.num_experts.size() > layers.size()) {
      const int64_t expected = ms.num_experts[layers.size()];
      if (expected > static_cast<int64_t>(paths.size()))
        throw FormatError(fmt::format("{}: missing ({} gives MoE layer {} {} experts)",
                                      (dir / expert_file_name(id, static_cast<int>(paths.size()))).string(),
                                      ms.path.filename().string(), id, expected));
      if (expected < static_cast<int64_t>(paths.size()))
        throw FormatError(fmt::format("{}: does not belong ({} gives MoE layer {} {} experts)",
                                      paths.back().string(), ms.path.filename().string(), id, expected));
    }
    MoeLayer layer;
    layer.id = id;
    layer.experts = formats::read_all(paths, [&](const fs::path& p) { return read_state_dict(files, p); });
    for (size_t e = 0; e < paths.size(); ++e)
      check_expert_keys(layer.experts[e], paths[e], static_cast<int>(e), layer.experts_prefix);
    layers.push_back(std::move(layer));
  }
  if (!ms.num_experts.empty() && ms.num_experts.size() != layers.size())
    throw FormatError(fmt::format("{}: num_experts lists {} MoE layers, but the tag holds expert files of {}",
                                  ms.path.string(), ms.num_experts.size(), layers.size()));
  return layers;
}

int expert_count(const std::vector<MoeLayer>& layers) {
  size_t n = 0;
  for (const auto& l : layers) n += l.experts.size();
  return static_cast<int>(n);
}

std::vector<NamedTensor> splice_experts(const std::vector<NamedTensor>& module,
                                        const std::vector<MoeLayer>& layers) {
  std::vector<NamedTensor> out = module;
  for (const auto& layer : layers) {
    // `<module>.deepspeed_moe.` holds the gate, then the experts; a MoE with a residual MLP has more after.
    const std::string moe = layer.experts_prefix.substr(0, layer.experts_prefix.size() - kExpertsTail.size());
    const std::string owner = moe.substr(0, moe.size() - std::string_view("deepspeed_moe.").size());
    std::optional<size_t> after;
    for (const std::string& prefix : {moe, owner})
      for (size_t i = 0; i < out.size() && !after; ++i)
        if (out[i].name.starts_with(prefix)) {
          size_t last = i;
          while (last + 1 < out.size() && out[last + 1].name.starts_with(prefix)) ++last;
          after = last + 1;
        }
    const size_t at = after.value_or(out.size());
    std::vector<NamedTensor> experts;
    for (const auto& expert : layer.experts) experts.insert(experts.end(), expert.begin(), expert.end());
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), experts.begin(), experts.end());
  }
  return out;
}

MoeMasters assemble_moe_masters(const ModelStates& ms, const std::vector<OptimStates>& optim,
                                const std::vector<MoeLayer>& layers, const std::vector<NamedTensor>& module) {
  const auto& groups = *ms.param_shapes;
  const OptimStates& first = optim.front();
  if (first.expert_groups.size() != groups.size())
    throw FormatError(fmt::format(
        "{}: base_optimizer_state lists {} param groups but {} lists {} in param_shapes", first.path.string(),
        first.expert_groups.size(), ms.path.filename().string(), groups.size()));
  const int world = static_cast<int>(optim.size());
  MoeMasters out;
  std::vector<size_t> dense;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!first.expert_groups[g]) {
      dense.push_back(g);
      continue;
    }
    const int64_t edp = first.partition_count[g];
    for (const auto& r : optim)
      if (r.expert_groups.size() <= g || !r.expert_groups[g] || r.partition_count[g] != edp)
        throw FormatError(
            fmt::format("{}: param group {} is not the expert group of {} partitions that {} holds",
                        r.path.string(), g, edp, first.path.filename().string()));
    if (world % edp != 0)
      throw FormatError(
          fmt::format("{}: expert group {} is partitioned over {} ranks, which does not divide the "
                      "{} data-parallel ranks",
                      first.path.string(), g, edp, world));
    const int ep_size = world / static_cast<int>(edp);
    out.ep_size = std::max(out.ep_size, ep_size);
    for (int ep = 0; ep < ep_size; ++ep) {
      ModelStates shapes;
      shapes.path = ms.path;
      shapes.param_shapes.emplace().push_back(shapes_of_ep_rank(groups[g], ep, ep_size, layers, ms.path));
      std::vector<OptimStates> ranks;
      for (size_t r :
           expert_data_parallel_ranks(ep, ep_size, static_cast<int>(edp), ms.data_before_expert_parallel))
        ranks.push_back(only_groups(optim[r], {g}));
      for (auto& t : assemble_flat_groups(shapes, ranks)) out.masters.push_back(std::move(t));
    }
  }
  ModelStates dense_shapes;
  dense_shapes.path = ms.path;
  dense_shapes.param_shapes.emplace();
  for (size_t g : dense) dense_shapes.param_shapes->push_back(groups[g]);
  std::vector<OptimStates> dense_ranks;
  for (const auto& r : optim) dense_ranks.push_back(only_groups(r, dense));
  for (auto& t : assemble_flat_groups(dense_shapes, dense_ranks)) out.masters.push_back(std::move(t));
  check_against_expert_files(out.masters, layers, ms.path);
  out.masters = in_module_order(std::move(out.masters), module);
  return out;
}

std::vector<LogicalTensor> unlisted_frozen_experts(const std::vector<NamedTensor>& module,
                                                   const std::vector<LogicalTensor>& masters,
                                                   const std::vector<LogicalTensor>& frozen) {
  std::unordered_set<std::string_view> listed;
  for (const auto* list : {&masters, &frozen})
    for (const auto& t : *list) listed.insert(t.name);
  std::vector<LogicalTensor> out;
  for (const auto& e : module)
    if (split_expert_name(e.name) && !listed.count(e.name))
      out.push_back(whole_tensor(e.name, e.tensor, e.tensor.dtype, "frozen expert, from its expert file"));
  return out;
}

int expert_parallel_size_without_zero(io::FileSet& files, const TagFiles& tf, const ModelStates& ms,
                                      const std::vector<MoeLayer>& layers) {
  const fs::path dir = ms.path.parent_path();
  const auto name_of = [](int ep) { return fmt::format("expp_rank_{}_mp_rank_00_optim_states.pt", ep); };
  if (!tf.expert_optim_states.count(0))
    throw FormatError(fmt::format("{}: missing (without ZeRO every expert-parallel rank saves one)",
                                  (dir / name_of(0)).string()));
  const int ep_size = named_ep_size(read_expert_rank_optimizer(files, tf.expert_optim_states.at(0)))
                          .value_or(static_cast<int>(tf.expert_optim_states.rbegin()->first) + 1);
  for (int ep = 0; ep < ep_size; ++ep)
    if (!tf.expert_optim_states.count(ep))
      throw FormatError(
          fmt::format("{}: missing (expert-parallel size {})", (dir / name_of(ep)).string(), ep_size));
  if (static_cast<int>(tf.expert_optim_states.size()) != ep_size)
    throw FormatError(fmt::format("{}: does not belong (expert-parallel size {})",
                                  tf.expert_optim_states.rbegin()->second.string(), ep_size));
  for (const auto& l : layers)
    if (l.experts.size() % static_cast<size_t>(ep_size) != 0)
      throw FormatError(
          fmt::format("{}: MoE layer {} has {} experts, which {} expert-parallel ranks cannot share",
                      dir.string(), l.id, l.experts.size(), ep_size));
  return ep_size;
}

std::optional<MoeMasters> name_moe_unfused_masters(io::FileSet& files, const TagFiles& tf,
                                                   const ModelStates& ms, const std::vector<MoeLayer>& layers,
                                                   const std::vector<NamedTensor>& module, int ep_size) {
  std::vector<fs::path> paths;
  for (int ep = 0; ep < ep_size; ++ep) paths.push_back(tf.expert_optim_states.at(ep));
  const auto ranks =
      formats::read_all(paths, [&](const fs::path& p) { return read_expert_rank_optimizer(files, p); });
  const ExpertRankOptimizer& first = ranks.front();
  if (!first.unfused_fp32_groups) return std::nullopt;
  std::vector<size_t> dense, expert;
  for (size_t g = 0; g < first.expert_groups.size(); ++g) {
    (first.expert_groups[g] ? expert : dense).push_back(g);
    // Each EP rank's local experts are its share of every layer's experts only when all share one EP size.
    if (first.expert_groups[g] && first.group_names[g] != fmt::format("ep_size_{}", ep_size))
      throw UnsupportedError(
          fmt::format("{}: expert param group {} is named '{}', another than ep_size_{}: MoE "
                      "layers of several expert-parallel sizes are not supported yet",
                      first.path.string(), g, first.group_names[g], ep_size));
  }
  for (const auto& r : ranks)
    if (!r.unfused_fp32_groups || r.expert_groups != first.expert_groups)
      throw FormatError(
          fmt::format("{}: its FP16_UnfusedOptimizer param groups (fp32_groups, 'moe') are not those "
                      "of {}",
                      r.path.string(), first.path.filename().string()));
  // Each rank's optimizer state named as a model-state file's: its groups matched by the ZeRO-0 matcher to
  // the params they come from, dense groups to the dense params (`ms`'s module) ...
  const auto as_model_states = [&](const ExpertRankOptimizer& r, std::vector<NamedTensor> params) {
    ModelStates out;
    out.path = r.path;
    out.module = std::move(params);
    out.buffer_names = ms.buffer_names;
    out.shared_params = ms.shared_params;
    out.unfused_fp32_groups = r.unfused_fp32_groups;
    return out;
  };
  ModelStateMasters named = name_unfused_masters(as_model_states(first, *ms.module), dense);
  MoeMasters out;
  out.aliases = std::move(named.aliases);
  out.masters = std::move(named.trainable);
  // ... expert groups to the rank's own experts, under their global names, in module order.
  for (int ep = 0; ep < ep_size; ++ep) {
    std::vector<NamedTensor> local;
    for (const auto& e : module) {
      auto name = split_expert_name(e.name);
      if (!name) continue;
      const MoeLayer& layer = layer_of(layers, *name, ms.path, e.name);
      if (name->id / (static_cast<int>(layer.experts.size()) / ep_size) == ep) local.push_back(e);
    }
    for (auto& t : name_unfused_masters(as_model_states(ranks[ep], std::move(local)), expert).trainable)
      out.masters.push_back(std::move(t));
  }
  out.masters = in_module_order(std::move(out.masters), module);
  out.ep_size = ep_size;
  return out;
}

}  // namespace ckptfs::deepspeed
