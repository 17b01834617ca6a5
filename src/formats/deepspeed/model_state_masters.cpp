#include "formats/deepspeed/model_state_masters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "ckptfs/error.hpp"

namespace ckptfs::deepspeed {

namespace {

struct Master {
  const torch::SourceTensor* tensor;
  std::string where;  // optimizer.fp32_groups[g][i]
};

// Two state-dict entries are one parameter when torch.save wrote them as one view of one storage.
using StorageKey =
    std::tuple<const void*, uint64_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, DType>;

StorageKey storage_key(const torch::SourceTensor& t) {
  return {t.storage.file.get(), t.storage.offset, t.storage_offset, t.shape, t.strides, t.dtype};
}

// For each master of one group, the first (`forward`) or last candidate not `taken` it can take with every
// master keeping its order; empty when there is none.
std::vector<size_t> greedy_match(const std::vector<const NamedTensor*>& params,
                                 const std::vector<bool>& taken, const std::vector<Master>& masters,
                                 bool forward) {
  std::vector<size_t> at(masters.size());
  const size_t n = params.size(), m = masters.size();
  size_t p = 0;
  for (size_t k = 0; k < m; ++k) {
    const size_t mk = forward ? k : m - 1 - k;
    const auto index = [&] { return forward ? p : n - 1 - p; };
    while (p < n && (taken[index()] || params[index()]->tensor.shape != masters[mk].tensor->shape)) ++p;
    if (p == n) return {};
    at[mk] = index();
    ++p;
  }
  return at;
}

// `module`'s parameters (without buffers) and, apart, its tied repeats: an entry that is the same view of
// the same storage as an earlier one (torch.save wrote one tensor), or one `shared_params` declares.
struct Candidates {
  std::vector<const NamedTensor*> params;
  std::vector<std::pair<std::string, std::string>> aliases;
};

Candidates module_params(const ModelStates& ms) {
  Candidates out;
  const std::set<std::string> buffers(ms.buffer_names.begin(), ms.buffer_names.end());
  std::map<std::string, std::string> declared(ms.shared_params.begin(), ms.shared_params.end());
  std::map<StorageKey, std::string> owner_of;
  for (const auto& e : *ms.module) {
    if (buffers.count(e.name)) continue;
    auto [it, first] = owner_of.emplace(storage_key(e.tensor), e.name);
    if (!first || declared.count(e.name)) {
      out.aliases.emplace_back(e.name, first ? declared[e.name] : it->second);
      continue;
    }
    out.params.push_back(&e);
  }
  return out;
}

void require_floating(const ModelStates& ms, const torch::SourceTensor& t, const std::string& where) {
  if (!dtype_is_floating(t.dtype))
    throw FormatError(fmt::format("{}: {} is {}, not a floating-point master weight", ms.path.string(), where,
                                  dtype_torch_name(t.dtype)));
}

}  // namespace

ModelStateMasters name_unfused_masters(const ModelStates& ms) {
  std::vector<size_t> groups(ms.unfused_fp32_groups->size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g] = g;
  return name_unfused_masters(ms, groups);
}

ModelStateMasters name_unfused_masters(const ModelStates& ms, const std::vector<size_t>& groups) {
  Candidates candidates = module_params(ms);
  const auto& params = candidates.params;
  ModelStateMasters out;
  out.aliases = std::move(candidates.aliases);

  // Each group on its own (HF Trainer's decay / no-decay groups interleave in the module): its masters
  // must match one and only one run of the parameters the groups before it left.
  std::vector<bool> taken(params.size(), false);
  for (size_t g : groups) {
    std::vector<Master> masters;
    for (size_t i = 0; i < (*ms.unfused_fp32_groups)[g].size(); ++i)
      masters.push_back(
          {&(*ms.unfused_fp32_groups)[g][i], fmt::format("optimizer.fp32_groups[{}][{}]", g, i)});
    const auto earliest = greedy_match(params, taken, masters, true);
    if (earliest.empty() && !masters.empty())
      throw FormatError(fmt::format(
          "{}: the {} fp32 masters of optimizer.fp32_groups[{}] do not follow the order of the parameters in "
          "'module' (param groups in another order?): cannot tell which parameter each belongs to",
          ms.path.string(), masters.size(), g));
    const auto latest = greedy_match(params, taken, masters, false);
    for (size_t k = 0; k < masters.size(); ++k) {
      if (earliest[k] != latest[k])
        throw UnsupportedError(fmt::format(
            "{}: {} (shape {}) may be the master of {} or of {}: frozen parameters beside trainable ones of "
            "the same shape leave the fp32 masters ambiguous",
            ms.path.string(), masters[k].where, masters[k].tensor->shape, params[earliest[k]]->name,
            params[latest[k]]->name));
      const torch::SourceTensor& t = *masters[k].tensor;
      require_floating(ms, t, masters[k].where);
      taken[earliest[k]] = true;
      out.trainable.push_back(
          catalog::whole_tensor(params[earliest[k]]->name, t, DType::F32, masters[k].where));
    }
  }
  return out;
}

namespace {

// The views of one storage ordered by offset, when they tile it: contiguous, one after another from its
// first element to its last; empty otherwise.
std::vector<const NamedTensor*> tiling(std::vector<const NamedTensor*> views, uint64_t elements) {
  std::sort(views.begin(), views.end(),
            [](const auto* a, const auto* b) { return a->tensor.storage_offset < b->tensor.storage_offset; });
  uint64_t next = 0;
  for (const auto* v : views) {
    if (!v->tensor.is_contiguous() || static_cast<uint64_t>(v->tensor.storage_offset) != next) return {};
    next += v->tensor.numel();
  }
  return next == elements ? views : std::vector<const NamedTensor*>{};
}

// Elements [offset, offset + numel of `shape`) of the 1-D contiguous `flat`, as a tensor of `shape`.
torch::SourceTensor slice_as(const torch::SourceTensor& flat, uint64_t offset,
                             const std::vector<int64_t>& shape) {
  torch::SourceTensor t = flat;
  t.shape = shape;
  t.strides.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) t.strides[d - 1] = t.strides[d] * shape[d];
  t.storage_offset = flat.storage_offset + static_cast<int64_t>(offset);
  return t;
}

}  // namespace

ModelStateMasters slice_fused_masters(const ModelStates& ms) {
  Candidates candidates = module_params(ms);
  ModelStateMasters out;
  out.aliases = std::move(candidates.aliases);
  std::map<std::pair<const void*, uint64_t>, std::vector<const NamedTensor*>> by_storage;
  for (const auto* p : candidates.params)
    by_storage[{p->tensor.storage.file.get(), p->tensor.storage.offset}].push_back(p);
  struct Buffer {
    uint64_t elements;
    std::vector<const NamedTensor*> params;
    bool used = false;
  };
  std::vector<Buffer> buffers;
  for (auto& [storage, views] : by_storage) {
    const auto& t = views.front()->tensor;
    const uint64_t elements = t.storage.nbytes / dtype_size(t.dtype);
    if (auto params = tiling(views, elements); !params.empty())
      buffers.push_back({elements, std::move(params)});
  }
  for (size_t g = 0; g < ms.fused_fp32_groups_flat->size(); ++g) {
    const torch::SourceTensor& flat = (*ms.fused_fp32_groups_flat)[g];
    const std::string where = fmt::format("optimizer.fp32_groups_flat[{}]", g);
    require_floating(ms, flat, where);
    if (flat.shape.size() != 1 || !flat.is_contiguous())
      throw FormatError(fmt::format("{}: {} is not a flat 1-D tensor", ms.path.string(), where));
    if (flat.numel() == 0) continue;
    std::vector<Buffer*> fits;
    for (auto& b : buffers)
      if (!b.used && b.elements == flat.numel()) fits.push_back(&b);
    if (fits.empty())
      throw FormatError(
          fmt::format("{}: no 16-bit buffer of 'module' holds the {} elements of {} (its params are "
                      "not views into one flat buffer)",
                      ms.path.string(), flat.numel(), where));
    if (fits.size() > 1)
      throw UnsupportedError(
          fmt::format("{}: {} and {} both have the {} elements of {}: cannot tell which one is "
                      "its group",
                      ms.path.string(), fits[0]->params.front()->name, fits[1]->params.front()->name,
                      flat.numel(), where));
    fits.front()->used = true;
    for (const auto* p : fits.front()->params) {
      const auto offset = static_cast<uint64_t>(p->tensor.storage_offset);
      out.trainable.push_back(
          catalog::whole_tensor(p->name, slice_as(flat, offset, p->tensor.shape), DType::F32,
                                fmt::format("{} [{}, {})", where, offset, offset + p->tensor.numel())));
    }
  }
  return out;
}

}  // namespace ckptfs::deepspeed
