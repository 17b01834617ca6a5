#include "formats/megatron/bucketed_masters.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <map>
#include <optional>
#include <vector>

#include "ckptfs/error.hpp"
#include "formats/megatron/fp32_masters.hpp"
#include "formats/megatron/module_order.hpp"
#include "formats/megatron/split_rules.hpp"
#include "formats/megatron/state_names.hpp"
#include "formats/megatron/torch_dist_keys.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::megatron {

namespace {

using catalog::LogicalTensor;
namespace fs = std::filesystem;

constexpr std::string_view kDomainPrefix = "optimizer.distributed.dp_group_idx_";
constexpr int64_t kAlignment = 64;  // dp_reshardable exists since core 0.15: starts are always aligned

// Reads a decimal number at the front of `s` and drops it; nullopt when there is none.
std::optional<int64_t> take_number(std::string_view& s) {
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  s.remove_prefix(static_cast<size_t>(end - s.data()));
  return n;
}

// "optimizer.distributed.dp_group_idx_3.per_bucket_numel/shard_0_1" -> (3, "per_bucket_numel").
std::optional<std::pair<int64_t, std::string_view>> domain_key(std::string_view fqn) {
  if (!fqn.starts_with(kDomainPrefix)) return std::nullopt;
  fqn.remove_prefix(kDomainPrefix.size());
  const auto domain = take_number(fqn);
  if (!domain || !fqn.starts_with('.')) return std::nullopt;
  fqn.remove_prefix(1);
  return std::pair{*domain, fqn.substr(0, fqn.find('/'))};  // a ShardedObject's "/shard_<offset>_<shape>"
}

struct BucketKey {
  int64_t gbuf = 0, bucket = 0;
  std::string_view kind;  // param, exp_avg, exp_avg_sq
};

// "gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_1.param" (the dtype pair holds dots).
std::optional<BucketKey> bucket_key(std::string_view rest) {
  constexpr std::string_view kGbuf = "gbuf_idx_", kBucket = ".bucket_idx_";
  if (!rest.starts_with(kGbuf)) return std::nullopt;
  rest.remove_prefix(kGbuf.size());
  BucketKey out;
  const auto gbuf = take_number(rest);
  const size_t at = rest.rfind(kBucket);
  if (!gbuf || at == std::string_view::npos) return std::nullopt;
  rest.remove_prefix(at + kBucket.size());
  const auto bucket = take_number(rest);
  if (!bucket || !rest.starts_with('.')) return std::nullopt;
  out.gbuf = *gbuf;
  out.bucket = *bucket;
  out.kind = rest.substr(1);
  return out;
}

// How one model-parallel domain saved the buffer of one model chunk: dp_reshardable's bucket tensors with
// the recorded per_bucket_numel_unpadded, or dp_zero_gather_scatter's one compact tensor of
// numel_unpadded elements (distrib_optim.pt's coalesced layout, inside a pickled object).
struct DomainBuffer {
  std::vector<std::shared_ptr<const LogicalTensor>> buckets;
  std::vector<int64_t> bucket_sizes;
  std::optional<torch::SourceTensor> coalesced;
  int64_t numel_unpadded = 0;

  bool fits(const BufferLayout& layout) const {
    return coalesced ? layout.total == numel_unpadded : layout.bucket_sizes == bucket_sizes;
  }
  std::string describe() const {
    return coalesced ? fmt::format("{} elements", numel_unpadded)
                     : fmt::format("buckets of [{}] elements", fmt::join(bucket_sizes, ", "));
  }
  // The parameter at `offset` of `layout` (which fits), shaped `shape`.
  formats::RankTensor view(const BufferLayout& layout, int64_t offset, const std::vector<int64_t>& shape,
                           const fs::path& file) const {
    if (coalesced) return formats::rank_tensor(flat_view(*coalesced, offset, shape), file);
    size_t b = 0;
    int64_t start = 0;
    while (offset >= start + layout.bucket_sizes[b]) start += layout.bucket_sizes[b++];
    formats::RankTensor r = formats::rank_tensor(buckets[b], file);
    r.tensor = flat_view(r.tensor, offset - start, shape);
    return r;
  }
};

using Domain = std::vector<DomainBuffer>;  // per model chunk (gbuf_idx)

// [{(param_dtype, grad_dtype): [sizes]} per buffer] of per_bucket_numel_unpadded.
std::vector<std::vector<int64_t>> read_bucket_sizes(const formats::Field& list) {
  if (!list.is_list()) list.fail("expected the list of bucket sizes per buffer");
  std::vector<std::vector<int64_t>> out;
  for (size_t g = 0; g < list.size(); ++g) {
    const formats::Field per_dtype = list.at(g);
    if (!per_dtype.is_dict() || per_dtype.size() != 1)
      per_dtype.fail("expected the bucket sizes of one dtype");
    const formats::Field sizes(per_dtype.value().entries.front().second.get(), per_dtype.file(),
                               fmt::format("{}[{}]", list.path(), g));
    auto& row = out.emplace_back();
    for (size_t b = 0; b < sizes.size(); ++b) row.push_back(sizes.at(b).as_int());
  }
  return out;
}

// dp_zero_gather_scatter's param_state: torch.save([the coalesced dict distrib_optim.pt holds]).
Domain read_param_state(const formats::Field& state) {
  if (state.is_list())
    throw UnsupportedError(
        "the distributed optimizer's state of a chained optimizer (MoE) is not mapped yet");
  if (!state.is_dict() || !state["buckets_coalesced"].present())
    state.fail("expected the distributed optimizer's coalesced dict of buffers (megatron-core 0.7+)");
  size_t chunks = 0;  // the buffers are keyed 0, 1, ... (one per model chunk)
  for (const auto& entry : state.value().entries) chunks += entry.first->is(pickle::Kind::Int) ? 1 : 0;
  Domain out;
  for (size_t c = 0; c < chunks; ++c) {
    const formats::Field world = buffer_of(state, c);
    const torch::SourceTensor& flat = world["param"].as_tensor();
    DomainBuffer buffer;
    buffer.numel_unpadded = world["numel_unpadded"].as_int();
    if (flat.shape.size() != 1 || !flat.is_contiguous() || flat.dtype != DType::F32 ||
        flat.shape[0] != buffer.numel_unpadded)
      world["param"].fail(fmt::format("expected a flat float32 tensor of numel_unpadded = {} elements",
                                      buffer.numel_unpadded));
    buffer.coalesced = flat;
    out.push_back(std::move(buffer));
  }
  return out;
}

std::map<int64_t, Domain> read_domains(const dcp::Metadata& md, const dcp::ItemReader& reader) {
  std::map<int64_t, std::map<int64_t, std::map<int64_t, std::shared_ptr<const LogicalTensor>>>>
      buckets;                                                 // [i][g][b]
  std::map<int64_t, std::vector<std::vector<int64_t>>> sizes;  // [i][g][b]
  std::map<int64_t, Domain> gathered;                          // dp_zero_gather_scatter
  const std::string file = reader.metadata_path().string();
  for (const auto& item : md.items) {
    const auto key = domain_key(item.fqn);
    if (!key) continue;
    const auto [domain, rest] = *key;
    if (!item.is_tensor && (rest == "param_state" || rest == "per_bucket_numel_unpadded")) {
      const auto archive = reader.archive(item, item.location);
      const formats::Field value = formats::root_field(archive).at(0);  // a ShardedObject: torch.save([obj])
      if (rest == "param_state")
        gathered[domain] = read_param_state(value);
      else
        sizes[domain] = read_bucket_sizes(value);
      continue;
    }
    const auto bucket = bucket_key(rest);
    if (!bucket || bucket->kind != "param" || !item.is_tensor) continue;
    auto tensor = std::make_shared<const LogicalTensor>(reader.tensor(item));
    if (tensor->shape.size() != 1 || tensor->dtype != DType::F32)
      throw FormatError(fmt::format("{}: {} is not a 1-D float32 tensor", file, item.fqn));
    buckets[domain][bucket->gbuf][bucket->bucket] = std::move(tensor);
  }
  if (!gathered.empty()) {
    if (!buckets.empty())
      throw FormatError(fmt::format("{}: the distributed optimizer's state is saved in two layouts", file));
    return gathered;
  }
  std::map<int64_t, Domain> out;
  for (const auto& [i, recorded] : sizes) {
    Domain& domain = out[i];
    const auto& saved = buckets[i];
    if (saved.size() != recorded.size() ||
        (!saved.empty() && saved.rbegin()->first != static_cast<int64_t>(saved.size()) - 1))
      throw FormatError(fmt::format("{}: dp_group_idx_{} holds bucket tensors of {} buffers, {} recorded",
                                    file, i, saved.size(), recorded.size()));
    for (const auto& [g, tensors] : saved) {
      DomainBuffer& buffer = domain.emplace_back();
      buffer.bucket_sizes = recorded[g];
      for (const auto& [b, t] : tensors) {
        if (b != static_cast<int64_t>(buffer.buckets.size()) ||
            b >= static_cast<int64_t>(recorded[g].size()) || t->shape[0] != recorded[g][b])
          throw FormatError(
              fmt::format("{}: {} does not match per_bucket_numel_unpadded [{}] of dp_group_idx_{}", file,
                          t->name, fmt::join(recorded[g], ", "), i));
        buffer.buckets.push_back(t);
      }
      if (buffer.buckets.size() != recorded[g].size())
        throw FormatError(fmt::format("{}: dp_group_idx_{} gbuf_idx_{}: {} bucket tensors, {} recorded sizes",
                                      file, i, g, buffer.buckets.size(), recorded[g].size()));
    }
  }
  if (out.size() != buckets.size())
    throw FormatError(fmt::format("{}: bucket tensors without per_bucket_numel_unpadded", file));
  return out;
}

// The merged model's tensors in Megatron's order, split into what precedes the layers, each layer, and
// what follows.
struct ModelParts {
  std::vector<const LogicalTensor*> before, after;
  std::vector<std::vector<const LogicalTensor*>> layers;
  const LogicalTensor* word_embeddings = nullptr;
};

ModelParts model_parts(const catalog::Catalog& model, const ModelArgs& args, const std::string& file) {
  ModelParts out;
  out.layers.resize(static_cast<size_t>(args.num_layers));
  bool seen_layers = false;
  for (const auto& t : model.tensors) {
    if (const auto layer = parse_layer_name(t.name)) {
      if (layer->index < 0 || layer->index >= args.num_layers)
        throw FormatError(fmt::format("{}: {}: layer beyond num_layers {}", file, t.name, args.num_layers));
      out.layers[static_cast<size_t>(layer->index)].push_back(&t);
      seen_layers = true;
      continue;
    }
    (seen_layers ? out.after : out.before).push_back(&t);
    if (t.name.ends_with("word_embeddings.weight")) out.word_embeddings = &t;
  }
  return out;
}

// A parameter of one domain's model chunk: its local (TP-split) shape, and the merged tensor it is a part of
// (nullptr for the last stage's copy of a tied embedding, which the merged model does not serve).
struct DomainParam {
  ParamSlot slot;
  const LogicalTensor* merged = nullptr;
};

std::vector<int64_t> local_shape(const LogicalTensor& t, Split split, int tp, const std::string& file) {
  std::vector<int64_t> shape = t.shape;
  if (split == Split::Replicated) return shape;
  const size_t dim = split == Split::Columns ? 1 : 0;
  if (shape.size() <= dim || shape[dim] % tp != 0)
    throw FormatError(
        fmt::format("{}: {} [{}] does not split over TP {}", file, t.name, fmt::join(t.shape, ", "), tp));
  shape[dim] /= tp;
  return shape;
}

class DomainLayout {
 public:
  DomainLayout(const ModelParts& parts, const ModelArgs& args, int vp, std::string file)
      : parts_(parts), args_(args), vp_(vp), file_(std::move(file)) {}

  // The parameters of chunk `v` on stage `p` holding layers [first, first + count), in named_parameters
  // order.
  std::vector<DomainParam> chunk_params(int p, int v, int64_t first, int64_t count) const {
    std::vector<DomainParam> out;
    const bool tied_over_stages = args_.tied_embeddings && args_.pp > 1;
    const auto add = [&](const LogicalTensor* t, bool shared) {
      DomainParam d;
      d.slot.chunk = static_cast<size_t>(v);
      d.slot.name = t->name;
      d.slot.shape = local_shape(*t, split_of(t->name, args_), args_.tp, file_);
      d.slot.shared_embedding = shared;
      d.merged = t;
      out.push_back(std::move(d));
    };
    if (p == 0 && v == 0)
      for (const auto* t : parts_.before) add(t, tied_over_stages && t == parts_.word_embeddings);
    for (int64_t l = first; l < first + count; ++l)
      for (const auto* t : parts_.layers[static_cast<size_t>(l)]) add(t, false);
    if (p == args_.pp - 1 && v == vp_ - 1) {
      for (const auto* t : parts_.after) add(t, false);
      if (tied_over_stages && parts_.word_embeddings != nullptr) {  // the output layer: a synchronised copy
        add(parts_.word_embeddings, true);
        out.back().slot.name = "output_layer.weight";
        out.back().merged = nullptr;
      }
    }
    return out;
  }

 private:
  const ModelParts& parts_;
  const ModelArgs& args_;
  int vp_;
  std::string file_;
};

std::optional<BufferLayout> matching_layout(const std::vector<DomainParam>& params, const DomainBuffer& saved,
                                            const ModelArgs& args) {
  std::vector<const ParamSlot*> slots;
  for (const auto& p : params) slots.push_back(&p.slot);
  // One bucket per buffer unless gradient reduction overlapped the backward pass (then buckets of
  // ddp_bucket_size elements, except on later pipeline stages and virtual chunks).
  std::vector<std::optional<int64_t>> bucketings = {std::nullopt};
  if (args.ddp_bucket_size) bucketings.push_back(args.ddp_bucket_size);
  for (const auto& bucketing : bucketings) {
    BufferLayout layout = buffer_layout(slots, kAlignment, bucketing);
    if (saved.fits(layout)) return layout;
  }
  return std::nullopt;
}

}  // namespace

bool has_bucketed_masters(const dcp::Metadata& md) {
  return std::any_of(md.items.begin(), md.items.end(), [](const dcp::Item& item) {
    return std::holds_alternative<BucketedOptimizerKey>(classify_torch_dist_key(item.fqn));
  });
}

std::shared_ptr<catalog::Catalog> masters_from_buckets(const dcp::Metadata& md, const dcp::ItemReader& reader,
                                                       const catalog::Catalog& model, const ModelArgs& args) {
  const std::string file = reader.metadata_path().string();
  if (args.num_experts > 0)
    throw UnsupportedError(
        "the distributed optimizer's state of a MoE model (a chained optimizer) is not mapped yet");
  // The buffers pack the parameters in reverse named_parameters order. With DP > 1 .metadata's key order is
  // not the model's (the replicas share the writing), so only a model in the known module order will do.
  if (args.dp > 1 && !module_order_known(model.tensors))
    throw UnsupportedError(
        "the model has modules whose parameter order ckptfs does not know, and .metadata's order "
        "is not the model's at data parallel > 1");
  const auto domains = read_domains(md, reader);
  const int64_t world = int64_t{args.tp} * args.pp;
  if (static_cast<int64_t>(domains.size()) != world || domains.rbegin()->first != world - 1)
    throw FormatError(
        fmt::format("{}: the distributed optimizer saved {} model-parallel domains, TP {} x PP {} expected",
                    file, domains.size(), args.tp, args.pp));
  const int vp = static_cast<int>(domains.begin()->second.size());
  for (const auto& [i, d] : domains)
    if (static_cast<int>(d.size()) != vp)
      throw FormatError(
          fmt::format("{}: dp_group_idx_{} saved {} buffers, dp_group_idx_0 {}", file, i, d.size(), vp));

  // Layers per chunk, in VP-major order: the count whose buffer layout fits what TP rank 0 of the stage
  // saved (dp_group_idx = pp x TP + tp, the rank in the model-parallel group); the other TP ranks must fit
  // it too.
  const ModelParts parts = model_parts(model, args, file);
  const DomainLayout layout(parts, args, vp, file);
  std::map<std::string_view, std::vector<formats::RankTensor>> ranks;  // merged name -> per TP rank
  int64_t next_layer = 0;
  for (int v = 0; v < vp; ++v)
    for (int p = 0; p < args.pp; ++p) {
      const DomainBuffer& saved = domains.at(int64_t{p} * args.tp)[static_cast<size_t>(v)];
      std::optional<BufferLayout> found;
      std::vector<DomainParam> params;
      for (int64_t count = 0; !found && next_layer + count <= args.num_layers; ++count) {
        params = layout.chunk_params(p, v, next_layer, count);
        found = matching_layout(params, saved, args);
        if (found) next_layer += count;
      }
      if (!found)
        throw FormatError(
            fmt::format("{}: the distributed optimizer's buffer of stage {} chunk {} ({}) fits no count of "
                        "the model's layers",
                        file, p, v, saved.describe()));
      for (int tp = 0; tp < args.tp; ++tp) {
        const int64_t i = int64_t{p} * args.tp + tp;
        const DomainBuffer& buffer = domains.at(i)[static_cast<size_t>(v)];
        if (!buffer.fits(*found))
          throw FormatError(fmt::format("{}: dp_group_idx_{} chunk {} saved {}, TP rank 0 {}", file, i, v,
                                        buffer.describe(), saved.describe()));
        for (size_t k = 0; k < params.size(); ++k) {
          if (params[k].merged == nullptr) continue;
          auto& slot = ranks[params[k].merged->name];
          if (slot.empty()) slot.resize(static_cast<size_t>(args.tp));
          slot[static_cast<size_t>(tp)] =
              buffer.view(*found, found->offsets[k], params[k].slot.shape, reader.metadata_path());
        }
      }
    }
  if (next_layer != args.num_layers)
    throw FormatError(fmt::format("{}: the distributed optimizer's buckets hold {} layers, num_layers is {}",
                                  file, next_layer, args.num_layers));

  auto out = std::make_shared<catalog::Catalog>();
  for (const auto& t : model.tensors) {
    const auto it = ranks.find(t.name);
    if (it == ranks.end())
      throw FormatError(fmt::format("{}: no fp32 master of {} in the optimizer's buckets", file, t.name));
    out->tensors.push_back(formats::merge_tensor_parallel(t.name, split_of(t.name, args), it->second,
                                                          DType::F32, nullptr, t.name));
  }
  return out;
}

}  // namespace ckptfs::megatron
