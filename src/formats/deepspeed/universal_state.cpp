#include "formats/deepspeed/universal_state.hpp"

#include <fmt/format.h>

#include <unordered_map>

#include "ckptfs/error.hpp"
#include "formats/deepspeed/partition_assembly.hpp"
#include "formats/value_tensors.hpp"

namespace ckptfs::deepspeed {

namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

ValuePtr entry(const Value* dict, std::string_view key) {
  if (dict == nullptr || (dict->kind != Kind::Dict && dict->kind != Kind::Object)) return nullptr;
  ValuePtr found;
  for (const auto& [k, v] : dict->entries)
    if (k->is(Kind::String) && k->text == key) found = v;  // the last one wins, as in Python
  return found;
}

ValuePtr group_entry(const Value* state, int64_t group) {
  if (state == nullptr || state->kind != Kind::Dict) return nullptr;
  for (const auto& [k, v] : state->entries)
    if (k->is(Kind::Int) && k->integer == group) return v;
  return nullptr;
}

ValuePtr string_value(std::string text) {
  auto v = pickle::make_value(Kind::String);
  v->text = std::move(text);
  return v;
}

ValuePtr int_value(int64_t n) {
  auto v = pickle::make_value(Kind::Int);
  v->integer = n;
  return v;
}

// A list like `list` with every item replaced by `n`.
ValuePtr list_of(const ValuePtr& list, int64_t n) {
  auto v = pickle::make_value(Kind::List);
  if (list && list->is(Kind::List))
    for (size_t i = 0; i < list->items.size(); ++i) v->items.push_back(int_value(n));
  return v;
}

// The raw state[g]['step'] of the wrapped optimizer: a 0-d tensor for torch's Adam, a plain number
// for others; null when absent.
ValuePtr raw_group_step(const OptimStates& rank0, int64_t group) {
  const ValuePtr state = entry(entry(rank0.inner.get(), "base_optimizer_state").get(), "state");
  return entry(group_entry(state.get(), group).get(), "step");
}

}  // namespace

std::optional<OptimizerState> read_optimizer_state(const ModelStates& shapes_file,
                                                   const std::vector<OptimStates>& ranks, bool zero3,
                                                   std::string& why_not) {
  const OptimStates& rank0 = ranks.front();
  auto first = rank0.group_state.find(0);
  if (first == rank0.group_state.end()) {
    why_not =
        fmt::format("{}: no per-parameter optimizer state (an elastic checkpoint?)", rank0.path.string());
    return std::nullopt;
  }
  OptimizerState out;
  for (const auto& t : first->second)
    if (t.name != "step" && t.tensor.shape.size() == 1) out.keys.push_back(t.name);
  if (out.keys.empty()) {
    why_not = fmt::format("{}: the optimizer keeps no per-parameter tensors", rank0.path.string());
    return std::nullopt;
  }
  for (size_t k = 0; k < out.keys.size(); ++k) {
    auto tensors = zero3 ? assemble_zero3_state(shapes_file, ranks, out.keys[k])
                         : assemble_flat_state(shapes_file, ranks, out.keys[k]);
    out.tensors.resize(tensors.size());
    for (size_t p = 0; p < tensors.size(); ++p) out.tensors[p].push_back(std::move(tensors[p]));
  }
  out.steps.resize(out.tensors.size());
  if (zero3) return out;  // ZeRO-3 keeps its step in optimizer_state.pt only
  // Each group's step as ds_to_universal saves it in step.pt: tensors go into a catalog of their own.
  auto steps = std::make_shared<catalog::Catalog>();
  const auto& groups = *shapes_file.param_shapes;
  std::vector<ValuePtr> raw(groups.size());
  std::vector<int64_t> tensor_index(groups.size(), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    raw[g] = raw_group_step(rank0, static_cast<int64_t>(g));
    if (const auto* t = raw[g] ? torch::as_tensor(raw[g].get()) : nullptr) {
      tensor_index[g] = static_cast<int64_t>(steps->tensors.size());
      steps->tensors.push_back(
          whole_tensor(fmt::format("step of group {}", g), *t, t->dtype, "optimizer step"));
    } else if (raw[g] && !raw[g]->is(Kind::Int) && !raw[g]->is(Kind::Float)) {
      raw[g] = nullptr;
    }
  }
  size_t p = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    ValuePtr step = raw[g];
    if (tensor_index[g] >= 0)
      step = catalog::tensor_value({steps, static_cast<size_t>(tensor_index[g])},
                                   torch::as_tensor(raw[g].get())->requires_grad);
    for (size_t i = 0; i < groups[g].size(); ++i) out.steps[p++] = step;
  }
  return out;
}

pickle::ValuePtr universal_optimizer_state(const OptimStates& rank0, int64_t world_size, bool zero3,
                                           std::shared_ptr<catalog::Catalog> tensors) {
  const ValuePtr& inner = rank0.inner;
  if (!inner || !inner->is(Kind::Dict))
    throw FormatError(fmt::format("{}: optimizer_state_dict is not a dict", rank0.path.string()));
  auto out = pickle::make_value(Kind::Dict);
  ValuePtr param_groups;
  if (zero3) {
    out->entries = inner->entries;
    param_groups = entry(entry(inner.get(), "optimizer_state_dict").get(), "param_groups");
  } else {
    for (const auto& [k, v] : inner->entries) {
      const std::string_view key = k->is(Kind::String) ? std::string_view(k->text) : std::string_view();
      if (key == "base_optimizer_state" || key == "single_partition_of_fp32_groups" ||
          key == "param_slice_mappings")
        continue;
      if (key == "group_paddings") {
        out->entries.emplace_back(k, list_of(v, 0));
      } else if (key == "partition_count") {
        out->entries.emplace_back(k, v->is(Kind::List) ? list_of(v, world_size) : int_value(world_size));
      } else {
        out->entries.emplace_back(k, v);
      }
    }
    param_groups = entry(entry(inner.get(), "base_optimizer_state").get(), "param_groups");
  }
  if (param_groups) out->entries.emplace_back(string_value("param_groups"), param_groups);
  return formats::with_logical_tensors(out, std::move(tensors), "optimizer_state");
}

}  // namespace ckptfs::deepspeed
