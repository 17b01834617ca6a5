#include "formats/megatron/fp32_masters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <optional>

#include "ckptfs/error.hpp"

namespace ckptfs::megatron {

namespace {

using formats::Field;

bool no_weight_decay(const ParamSlot& p) {
  return p.shape.size() <= 1 || p.name.ends_with(".bias");
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Param groups as lists of indexes into `params`, per candidate grouping rule.
std::vector<std::vector<std::vector<size_t>>> candidate_groupings(const std::vector<ParamSlot>& params) {
  std::vector<size_t> decay, no_decay, all;
  for (size_t i = 0; i < params.size(); ++i) {
    (no_weight_decay(params[i]) ? no_decay : decay).push_back(i);
    all.push_back(i);
  }
  std::vector<std::vector<std::vector<size_t>>> out;
  out.push_back({decay, no_decay});
  out.push_back({no_decay, decay});
  out.push_back({all});
  for (auto& grouping : out) std::erase_if(grouping, [](const auto& g) { return g.empty(); });
  return out;
}

bool matches(const Field& groups, const std::vector<std::vector<size_t>>& grouping,
             const std::vector<ParamSlot>& params) {
  if (groups.size() != grouping.size()) return false;
  for (size_t g = 0; g < grouping.size(); ++g) {
    const Field group = groups.at(g);
    if (!group.is_list() || group.size() != grouping[g].size()) return false;
    for (size_t i = 0; i < grouping[g].size(); ++i) {
      const auto* t = torch::as_tensor(group.at(i).value());
      if (t == nullptr || t->shape != params[grouping[g][i]].shape || t->dtype != DType::F32) return false;
    }
  }
  return true;
}

}  // namespace

torch::SourceTensor flat_view(const torch::SourceTensor& flat, int64_t offset,
                              const std::vector<int64_t>& shape) {
  torch::SourceTensor out = flat;
  out.shape = shape;
  out.strides.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) out.strides[d - 1] = out.strides[d] * shape[d];
  out.storage_offset = flat.storage_offset + offset;
  return out;
}

BufferLayout buffer_layout(const std::vector<const ParamSlot*>& params, int64_t alignment,
                           std::optional<int64_t> bucket_size) {
  const auto align_up = [&](int64_t n) {
    return alignment <= 1 ? n : (n + alignment - 1) / alignment * alignment;
  };
  BufferLayout out;
  out.offsets.resize(params.size());
  int64_t base = 0, cur = 0;
  const auto close_bucket = [&] {
    out.bucket_sizes.push_back(cur);
    base += cur;
    cur = 0;
  };
  for (size_t k = params.size(); k-- > 0;) {
    const ParamSlot& p = *params[k];
    cur = align_up(cur);
    if (p.shared_embedding && cur > 0) close_bucket();
    out.offsets[k] = base + cur;
    cur += numel(p.shape);
    if (p.shared_embedding || (bucket_size && cur >= *bucket_size)) close_bucket();
  }
  if (cur > 0) close_bucket();
  out.total = base;
  return out;
}

namespace {

std::vector<torch::SourceTensor> masters_from_fp16_params(const Field& optimizer,
                                                          const std::vector<ParamSlot>& params) {
  if (params.empty()) return {};
  const Field groups = optimizer["fp32_from_fp16_params"];
  if (!groups.is_list()) groups.fail("expected the list of fp32 master groups");
  for (const auto& grouping : candidate_groupings(params)) {
    if (!matches(groups, grouping, params)) continue;
    std::vector<torch::SourceTensor> out(params.size());
    for (size_t g = 0; g < grouping.size(); ++g)
      for (size_t i = 0; i < grouping[g].size(); ++i) out[grouping[g][i]] = groups.at(g).at(i).as_tensor();
    return out;
  }
  std::vector<size_t> sizes;
  for (size_t g = 0; g < groups.size(); ++g)
    sizes.push_back(groups.at(g).is_list() ? groups.at(g).size() : 0);
  groups.fail(
      fmt::format("{} groups of [{}] tensors do not match the model's {} parameters in order "
                  "(weights, then 1-D tensors and biases)",
                  sizes.size(), fmt::join(sizes, ", "), params.size()));
}

using StateMasters =
    std::function<std::vector<torch::SourceTensor>(const Field& state, const std::vector<ParamSlot>&)>;

// The masters of a ChainedOptimizer's state list (MoE: the dense parameters' optimizer, then the routed
// experts'), each entry read by `read` over its own parameters. An entry may be None where another rank
// file holds it (`dense_elsewhere`: the dense state of an EP rank > 0); those masters stay empty.
std::vector<torch::SourceTensor> chained_masters(const Field& list, const std::vector<ParamSlot>& params,
                                                 bool dense_elsewhere, const StateMasters& read) {
  std::vector<torch::SourceTensor> out(params.size());
  for (bool expert : {false, true}) {
    std::vector<ParamSlot> part;
    std::vector<size_t> index;
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].expert == expert) {
        part.push_back(params[i]);
        index.push_back(i);
      }
    if (part.empty()) continue;
    if (expert && list.size() < 2) list.fail("one optimizer for dense and expert parameters (expected two)");
    const Field state = list.at(expert ? 1 : 0);
    if (!state.present()) {
      if (!expert && dense_elsewhere) continue;
      state.fail("None, but this rank file's parameters have their masters nowhere else");
    }
    const auto masters = read(state, part);
    for (size_t k = 0; k < index.size(); ++k) out[index[k]] = masters[k];
  }
  return out;
}

}  // namespace

std::vector<torch::SourceTensor> masters_from_optimizer(const Field& optimizer,
                                                        const std::vector<ParamSlot>& params) {
  if (!optimizer.is_list()) return masters_from_fp16_params(optimizer, params);
  return chained_masters(optimizer, params, false, masters_from_fp16_params);
}

namespace {

// One model chunk's saved buffer: one flat tensor holding the buckets end to end (coalesced, 2023), or
// one tensor per bucket (core 0.4-0.6). A tensor is either exactly as long as its recorded unpadded size
// (`unpadded`: numel_unpadded, per_bucket_numel_unpadded) or, where no size is recorded, padded at its end
// to a multiple of the DP size.
struct SavedBuffer {
  std::vector<torch::SourceTensor> tensors;
  std::vector<int64_t> unpadded;  // per tensor; empty when the file records none
  bool per_bucket = false;

  bool holds(int64_t size, size_t t, int dp) const {
    const int64_t length = tensors[t].shape[0];
    if (size > length) return false;
    return unpadded.empty() ? (size + dp - 1) / dp * dp == length : size == unpadded[t];
  }
  bool fits(const BufferLayout& layout, int dp) const {
    if (!per_bucket) return holds(layout.total, 0, dp);
    if (layout.bucket_sizes.size() != tensors.size()) return false;
    for (size_t b = 0; b < tensors.size(); ++b)
      if (!holds(layout.bucket_sizes[b], b, dp)) return false;
    return true;
  }
  // Where the buffer keeps the parameter at `offset` of the layout.
  torch::SourceTensor view(const BufferLayout& layout, int64_t offset,
                           const std::vector<int64_t>& shape) const {
    if (!per_bucket) return flat_view(tensors[0], offset, shape);
    size_t b = 0;
    for (int64_t start = 0;; start += layout.bucket_sizes[b++])
      if (offset < start + layout.bucket_sizes[b]) return flat_view(tensors[b], offset - start, shape);
  }
};

}  // namespace

Field buffer_of(const Field& root, size_t c) {
  const pickle::Value* buffer = nullptr;
  for (const auto& [k, v] : root.value().entries)
    if (k->is(pickle::Kind::Int) && k->integer == static_cast<int64_t>(c)) buffer = v.get();
  const Field buf(buffer, root.file(), fmt::format("{}[{}]", root.path(), c));
  if (!buf.is_dict() || buf.size() != 1)
    buf.fail("expected one buffer (one grad dtype) for the model chunk (several are not supported yet)");
  return Field(buffer->entries.front().second.get(), buf.file(), buf.path() + "[dtype]");
}

namespace {

// The list of one buffer's bucket sizes in per_bucket_numel_unpadded ([{dtype: [sizes]} per buffer]).
std::vector<int64_t> recorded_bucket_sizes(const Field& sizes, size_t c) {
  const Field per_dtype = sizes.at(c);
  if (!per_dtype.is_dict() || per_dtype.size() != 1) per_dtype.fail("expected one dtype's bucket sizes");
  const Field list(per_dtype.value().entries.front().second.get(), per_dtype.file(),
                   per_dtype.path() + "[dtype]");
  std::vector<int64_t> out;
  for (size_t b = 0; b < list.size(); ++b) out.push_back(list.at(b).as_int());
  return out;
}

// The masters of `params` in one distributed optimizer's state (a dict of buffers, `root`).
std::vector<torch::SourceTensor> masters_from_buffers(const Field& root, const std::vector<ParamSlot>& params,
                                                      int dp, std::optional<int64_t> bucket_size) {
  if (!root.is_dict()) root.fail("expected the distributed optimizer's dict of buffers");
  // Three layouts by era (docs/formats/megatron.md): coalesced (core 0.7+: numel_unpadded, 64-element
  // aligned starts since 0.8), a list of bucket tensors (core 0.4-0.6), one padded buffer (2023-05).
  const bool coalesced = root["buckets_coalesced"].present();
  const bool bucket_lists = !coalesced && root["per_bucket_numel"].present();
  std::vector<torch::SourceTensor> out(params.size());
  size_t chunks = 0;
  for (const auto& p : params) chunks = std::max(chunks, p.chunk + 1);
  for (size_t c = 0; c < chunks; ++c) {
    const Field world = buffer_of(root, c);
    const Field param = world["param"];
    SavedBuffer saved;
    saved.per_bucket = bucket_lists;
    if (bucket_lists && !param.is_list()) param.fail("expected the list of bucket tensors");
    for (size_t b = 0; b < (bucket_lists ? param.size() : 1); ++b) {
      const Field tensor = bucket_lists ? param.at(b) : param;
      const torch::SourceTensor& flat = tensor.as_tensor();
      if (flat.shape.size() != 1 || !flat.is_contiguous() || flat.dtype != DType::F32)
        tensor.fail("expected a flat float32 tensor");
      saved.tensors.push_back(flat);
    }
    if (coalesced) saved.unpadded = {world["numel_unpadded"].as_int()};
    if (const Field sizes = root["per_bucket_numel_unpadded"];
        bucket_lists && sizes.is_list())  // core 0.5-0.6
      saved.unpadded = recorded_bucket_sizes(sizes, c);
    if (!saved.unpadded.empty() && saved.unpadded.size() != saved.tensors.size())
      param.fail(
          fmt::format("{} bucket tensors, {} recorded sizes", saved.tensors.size(), saved.unpadded.size()));
    std::vector<const ParamSlot*> chunk;
    std::vector<size_t> index;
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].chunk == c) {
        chunk.push_back(&params[i]);
        index.push_back(i);
      }
    bool found = false;
    // One bucket per buffer unless gradient reduction overlapped the backward pass (then buckets of
    // bucket_size elements, except on later pipeline stages and virtual chunks).
    std::vector<std::optional<int64_t>> bucketings = {std::nullopt};
    if (bucket_size) bucketings.push_back(bucket_size);
    for (int64_t alignment : coalesced ? std::vector<int64_t>{64, 1} : std::vector<int64_t>{1})
      for (const auto& bucketing : bucketings) {
        if (found) break;
        const BufferLayout layout = buffer_layout(chunk, alignment, bucketing);
        if (!saved.fits(layout, dp)) continue;
        for (size_t k = 0; k < chunk.size(); ++k)
          out[index[k]] = saved.view(layout, layout.offsets[k], chunk[k]->shape);
        found = true;
      }
    if (!found) {
      std::vector<int64_t> lengths;
      for (const auto& t : saved.tensors) lengths.push_back(t.shape[0]);
      param.fail(fmt::format(
          "its [{}] elements do not hold the {} parameters of model chunk {} under any known buffer "
          "layout{}",
          fmt::join(lengths, ", "), chunk.size(), c,
          saved.unpadded.empty() ? "" : fmt::format(" (unpadded [{}])", fmt::join(saved.unpadded, ", "))));
    }
  }
  return out;
}

}  // namespace

std::vector<torch::SourceTensor> masters_from_distrib_optim(const torch::TorchArchive& archive,
                                                            const std::vector<ParamSlot>& params, int dp,
                                                            std::optional<int64_t> bucket_size, int ep_rank) {
  const Field root = formats::root_field(archive);
  if (!root.is_list()) return masters_from_buffers(root, params, dp, bucket_size);
  // EP ranks > 0 are not the dense optimizer's DP rank 0: their file holds None for it (EP rank 0's has it).
  return chained_masters(root, params, ep_rank > 0,
                         [&](const Field& state, const std::vector<ParamSlot>& part) {
                           return masters_from_buffers(state, part, dp, bucket_size);
                         });
}

}  // namespace ckptfs::megatron
