#include "formats/deepspeed/state_files.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "formats/pickle_access.hpp"

namespace ckptfs::deepspeed {

using formats::Field;
using formats::root_field;

namespace {

uint64_t checked_numel(const Field& field, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / 2 / static_cast<uint64_t>(d)) field.fail("shape overflows");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::vector<NamedShape> read_shapes(const Field& dict) {
  std::vector<NamedShape> out;
  for (const auto& [name, value] : dict.items()) {
    auto shape = value.as_shape();
    out.push_back({name, shape, checked_numel(value, shape)});
  }
  return out;
}

// Tensors of a name -> tensor dict; non-tensor entries (module extra state) are skipped.
std::vector<NamedTensor> read_tensors(const Field& dict) {
  std::vector<NamedTensor> out;
  for (const auto& [name, value] : dict.items())
    if (const auto* t = torch::as_tensor(&value.value())) out.push_back({name, *t});
  return out;
}

void require_flat(const Field& field, const torch::SourceTensor& t) {
  if (t.shape.size() != 1)
    field.fail(fmt::format("expected a 1-D flat tensor, found {} dimensions", t.shape.size()));
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    field.fail(fmt::format("expected floating-point master weights, found {}", dtype_torch_name(t.dtype)));
}

// {group index: {key: tensor or number}}; anything else (an elastic checkpoint's per-group list, a
// missing state) leaves `out` empty: the tag then has no optimizer moments to show.
void read_group_state(const Field& state, std::map<int64_t, std::vector<NamedTensor>>& out) {
  if (!state.present() || !state.value().is(pickle::Kind::Dict)) return;
  for (const auto& [key, value] : state.value().entries) {
    if (!key->is(pickle::Kind::Int) || !value->is(pickle::Kind::Dict)) continue;
    auto& tensors = out[key->integer];
    for (const auto& [name, item] : value->entries)
      if (const auto* t = torch::as_tensor(item.get()); t && name->is(pickle::Kind::String))
        tensors.push_back({name->text, *t});
  }
}

// {name: fragment_address(numel, start)} -> the names ordered by start.
std::vector<std::string> names_by_start(const Field& mapping) {
  std::vector<std::pair<int64_t, std::string>> by_start;
  for (const auto& [name, address] : mapping.items()) by_start.emplace_back(address["start"].as_int(), name);
  std::stable_sort(by_start.begin(), by_start.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> names;
  for (auto& [start, name] : by_start) names.push_back(std::move(name));
  return names;
}

// FP16_UnfusedOptimizer's fp32_groups: per param group, its masters in order.
std::vector<std::vector<torch::SourceTensor>> read_fp32_groups(const Field& groups) {
  std::vector<std::vector<torch::SourceTensor>> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = out.emplace_back();
    for (size_t i = 0; i < groups.at(g).size(); ++i) group.push_back(groups.at(g).at(i).as_tensor());
  }
  return out;
}

// Per torch param group, whether it is a MoE expert group (`'moe': True`, moe/utils.py).
std::vector<bool> expert_flags(const Field& param_groups) {
  std::vector<bool> out;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    Field moe = param_groups.at(g)["moe"];
    out.push_back(moe.present() && moe.value().is(pickle::Kind::Bool) && moe.value().boolean);
  }
  return out;
}

}  // namespace

ModelStates read_model_states(io::FileSet& files, const std::filesystem::path& path) {
  auto archive = torch::TorchArchive::open(files.open(path));
  Field root = root_field(archive);
  if (!root.is_dict()) root.fail("not a DeepSpeed model-state file (expected a dict)");
  if (!root["buffer_names"].present() && !root["module"].present())
    root.fail("not a DeepSpeed model-state file (no 'module' or 'buffer_names')");

  ModelStates ms;
  ms.path = path;
  if (root["module"].present()) ms.module = read_tensors(root["module"]);
  if (auto names = root["buffer_names"]; names.present())
    for (size_t i = 0; i < names.size(); ++i) ms.buffer_names.push_back(names.at(i).as_string());
  if (auto shapes = root["param_shapes"]; shapes.present()) {
    ms.param_shapes.emplace();
    // Old checkpoints (< v0.5.4) hold a single dict instead of a list per group.
    if (shapes.is_dict()) {
      ms.param_shapes->push_back(read_shapes(shapes));
    } else {
      for (size_t g = 0; g < shapes.size(); ++g) ms.param_shapes->push_back(read_shapes(shapes.at(g)));
    }
  }
  if (auto frozen = root["frozen_param_shapes"]; frozen.present())
    ms.frozen_param_shapes = read_shapes(frozen);
  if (auto frags = root["frozen_param_fragments"]; frags.present())
    ms.frozen_param_fragments = read_tensors(frags);
  if (auto shared = root["shared_params"]; shared.present())
    for (const auto& [alias, owner] : shared.items()) ms.shared_params.emplace_back(alias, owner.as_string());
  if (auto stage = root["ds_config"]["zero_optimization"]["stage"];
      stage.present() && stage.value().is(pickle::Kind::Int))
    ms.config_zero_stage = stage.as_int();
  for (const auto& [key, dtype] : {std::pair{"bf16", DType::BF16}, std::pair{"fp16", DType::F16}})
    if (auto on = root["ds_config"][key]["enabled"];
        on.present() && on.value().is(pickle::Kind::Bool) && on.value().boolean)
      ms.config_dtype = dtype;
  if (auto dp = root["dp_world_size"]; dp.present() && dp.value().is(pickle::Kind::Int))
    ms.dp_world_size = dp.as_int();
  if (auto version = root["ds_version"]; version.present() && version.value().is(pickle::Kind::String))
    ms.ds_version = version.as_string();
  if (Field mappings = root["optimizer"]["param_slice_mappings"]; mappings.is_list())
    for (size_t g = 0; g < mappings.size(); ++g)
      ms.embedded_slice_names.push_back(names_by_start(mappings.at(g)));
  if (auto groups = root["optimizer"]["fp32_groups_flat"]; groups.present()) {
    ms.fused_fp32_groups_flat.emplace();
    for (size_t g = 0; g < groups.size(); ++g) ms.fused_fp32_groups_flat->push_back(groups.at(g).as_tensor());
  }
  if (auto groups = root["optimizer"]["fp32_groups"]; groups.present())
    ms.unfused_fp32_groups = read_fp32_groups(groups);
  if (auto experts = root["num_experts"]; experts.is_list())
    for (size_t i = 0; i < experts.size(); ++i) ms.num_experts.push_back(experts.at(i).as_int());
  if (auto d_e = root["ds_config"]["use_data_before_expert_parallel_"];
      d_e.present() && d_e.value().is(pickle::Kind::Bool))
    ms.data_before_expert_parallel = d_e.value().boolean;
  return ms;
}

OptimStates read_optim_states(io::FileSet& files, const std::filesystem::path& path) {
  auto archive = torch::TorchArchive::open(files.open(path));
  Field root = root_field(archive);
  Field osd = root["optimizer_state_dict"];
  if (!osd.is_dict()) root.fail("not a DeepSpeed optimizer-state file (no 'optimizer_state_dict' dict)");

  OptimStates os;
  os.path = path;
  if (auto stage = osd["zero_stage"]; stage.present()) os.zero_stage = stage.as_enum_int();
  Field count = osd["partition_count"];
  if (count.is_list()) {
    for (size_t g = 0; g < count.size(); ++g) os.partition_count.push_back(count.at(g).as_int());
  } else {
    os.partition_count.push_back(count.as_int());
  }
  for (int64_t c : os.partition_count)
    if (c < 1 || c > (1 << 20)) count.fail(fmt::format("invalid partition count {}", c));

  const bool zero3 = os.zero_stage && *os.zero_stage == 3;
  Field groups = osd[zero3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups"];
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& t = groups.at(g).as_tensor();
    require_flat(groups.at(g), t);
    os.fp32_groups.push_back(t);
  }
  read_group_state(zero3 ? osd["optimizer_state_dict"]["state"] : osd["base_optimizer_state"]["state"],
                   os.group_state);
  if (auto param_groups = osd["base_optimizer_state"]["param_groups"]; !zero3 && param_groups.is_list())
    os.expert_groups = expert_flags(param_groups);
  for (const auto& [key, value] : archive.root()->entries)
    if (key->is(pickle::Kind::String) && key->text == "optimizer_state_dict") os.inner = value;
  if (Field mappings = osd["param_slice_mappings"]; mappings.is_list())
    for (size_t g = 0; g < mappings.size(); ++g) os.slice_names.push_back(names_by_start(mappings.at(g)));
  if (!zero3 && os.partition_count.size() != os.fp32_groups.size())
    count.fail(fmt::format("lists {} groups but the file holds {} fp32 partitions", os.partition_count.size(),
                           os.fp32_groups.size()));
  return os;
}

ExpertRankOptimizer read_expert_rank_optimizer(io::FileSet& files, const std::filesystem::path& path) {
  auto archive = torch::TorchArchive::open(files.open(path));
  const Field optimizer = root_field(archive)["optimizer"];
  ExpertRankOptimizer out;
  out.path = path;
  // A torch optimizer's state_dict holds param_groups; FP16 optimizers wrap it in optimizer_state_dict.
  Field groups = optimizer["param_groups"];
  if (!groups.is_list()) groups = optimizer["optimizer_state_dict"]["param_groups"];
  if (!groups.is_list()) return out;
  out.expert_groups = expert_flags(groups);
  for (size_t g = 0; g < groups.size(); ++g) {
    const Field name = groups.at(g)["name"];
    out.group_names.push_back(name.present() && name.value().is(pickle::Kind::String) ? name.value().text
                                                                                      : "");
  }
  if (auto fp32 = optimizer["fp32_groups"]; fp32.present()) {
    out.unfused_fp32_groups = read_fp32_groups(fp32);
    if (out.unfused_fp32_groups->size() != out.expert_groups.size())
      fp32.fail(fmt::format("lists {} groups but optimizer_state_dict.param_groups {}",
                            out.unfused_fp32_groups->size(), out.expert_groups.size()));
  }
  out.fused = optimizer["fp32_groups_flat"].present();
  return out;
}

std::vector<NamedTensor> read_state_dict(io::FileSet& files, const std::filesystem::path& path) {
  auto archive = torch::TorchArchive::open(files.open(path));
  Field root = root_field(archive);
  if (!root.is_dict()) root.fail("expected a state dict");
  return read_tensors(root);
}

}  // namespace ckptfs::deepspeed
