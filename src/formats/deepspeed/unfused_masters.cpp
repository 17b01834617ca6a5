#include "formats/deepspeed/unfused_masters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
using StorageKey = std::tuple<const void*, uint64_t, int64_t, std::vector<int64_t>, std::vector<int64_t>, DType>;

StorageKey storage_key(const torch::SourceTensor& t) {
  return {t.storage.file.get(), t.storage.offset, t.storage_offset, t.shape, t.strides, t.dtype};
}

// For each master of one group, the first (`forward`) or last candidate not `taken` it can take with every
// master keeping its order; empty when there is none.
std::vector<size_t> greedy_match(const std::vector<const NamedTensor*>& params, const std::vector<bool>& taken,
                                 const std::vector<Master>& masters, bool forward) {
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

}  // namespace

UnfusedMasters name_unfused_masters(const ModelStates& ms) {
  UnfusedMasters out;
  const std::set<std::string> buffers(ms.buffer_names.begin(), ms.buffer_names.end());
  std::map<std::string, std::string> declared(ms.shared_params.begin(), ms.shared_params.end());
  std::map<StorageKey, std::string> owner_of;
  std::vector<const NamedTensor*> params;
  for (const auto& e : *ms.module) {
    if (buffers.count(e.name)) continue;
    auto [it, first] = owner_of.emplace(storage_key(e.tensor), e.name);
    if (!first || declared.count(e.name)) {
      out.aliases.emplace_back(e.name, first ? declared[e.name] : it->second);
      continue;
    }
    params.push_back(&e);
  }

  // Each group on its own (HF Trainer's decay / no-decay groups interleave in the module): its masters
  // must match one and only one run of the parameters the groups before it left.
  std::vector<bool> taken(params.size(), false);
  for (size_t g = 0; g < ms.unfused_fp32_groups->size(); ++g) {
    std::vector<Master> masters;
    for (size_t i = 0; i < (*ms.unfused_fp32_groups)[g].size(); ++i)
      masters.push_back({&(*ms.unfused_fp32_groups)[g][i], fmt::format("optimizer.fp32_groups[{}][{}]", g, i)});
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
      if (!dtype_is_floating(t.dtype))
        throw FormatError(fmt::format("{}: {} is {}, not a floating-point master weight", ms.path.string(),
                                      masters[k].where, dtype_torch_name(t.dtype)));
      taken[earliest[k]] = true;
      out.trainable.push_back(catalog::whole_tensor(params[earliest[k]]->name, t, DType::F32, masters[k].where));
    }
  }
  return out;
}

}  // namespace ckptfs::deepspeed
