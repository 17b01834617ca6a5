#include "formats/sharded_tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace ckptfs::formats {

using pickle::Kind;

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 40;  // keeps offset arithmetic far from overflow
constexpr size_t kMaxShards = 1 << 20;

bool is_sharded_tensor_class(const pickle::Value& v) {
  return (v.kind == Kind::Global || v.kind == Kind::Object) && v.name == "ShardedTensor" &&
         v.module.starts_with("torch.distributed._shard.sharded_tensor");
}

// ShardMetadata(shard_offsets, shard_sizes, placement=_remote_device("rank:R/device")).
ShardPlacement placement_of(const Field& meta) {
  ShardPlacement out{meta["shard_offsets"].as_shape(), meta["shard_sizes"].as_shape(), 0};
  const Field device = meta["placement"];
  if (!device.present()) meta.fail("a shard without a placement (rank)");
  out.rank = device["_rank"].as_int();
  if (out.offsets.size() != out.sizes.size()) meta.fail("shard offsets and sizes differ in length");
  for (size_t d = 0; d < out.sizes.size(); ++d)
    if (out.offsets[d] < 0 || out.sizes[d] < 0 || out.offsets[d] > kMaxElements ||
        out.sizes[d] > kMaxElements)
      meta.fail(fmt::format("shard at [{}] of size [{}]", fmt::join(out.offsets, ", "),
                            fmt::join(out.sizes, ", ")));
  return out;
}

// The metadata's shards cut the 1-D global tensor into disjoint runs that cover it exactly.
void check_tiling(const Field& field, const ShardedTensorValue& t) {
  if (t.global_size.size() != 1)
    field.fail(fmt::format("a {}-D ShardedTensor: only 1-D ones (FSDP's flat parameters) are read",
                           t.global_size.size()));
  std::vector<ShardPlacement> sorted = t.shards;
  std::set<int64_t> ranks;
  for (const auto& s : sorted) {
    if (s.offsets.size() != 1) field.fail("a shard of other rank than the tensor");
    if (s.rank < 0 || s.rank >= t.world_size)
      field.fail(fmt::format("a shard placed on rank {} of a world of {}", s.rank, t.world_size));
    if (!ranks.insert(s.rank).second) field.fail(fmt::format("rank {} holds two shards", s.rank));
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.offsets[0] < b.offsets[0]; });
  int64_t at = 0;
  for (const auto& s : sorted) {
    if (s.offsets[0] != at)
      field.fail(fmt::format("shards do not tile [0, {}): rank {}'s starts at {}, expected {}",
                             t.global_size[0], s.rank, s.offsets[0], at));
    at += s.sizes[0];
  }
  if (at != t.global_size[0])
    field.fail(fmt::format("shards do not tile [0, {}): they end at {}", t.global_size[0], at));
}

}  // namespace

std::optional<ShardedTensorValue> as_sharded_tensor(const Field& field) {
  const pickle::Value& v = field.value();
  if (v.kind != Kind::Object || !v.is_global("torch._tensor", "_rebuild_from_type_v2") || !v.args ||
      v.args->items.size() != 4 || !is_sharded_tensor_class(*v.args->items[1]))
    return std::nullopt;
  const Field call(v.args.get(), field.file(), field.path() + ".<args>");
  // (local_shards, metadata, ProcessGroupState, sharding_spec, init_rrefs): ShardedTensor.__getstate__
  const Field state = call.at(3);
  ShardedTensorValue out;
  const Field metadata = state.at(1);
  out.global_size = metadata["size"].as_shape();
  // _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
  if (call.at(2).at(2).as_shape() != out.global_size)
    field.fail("ShardedTensor size and its metadata's size differ");
  const pickle::Value& dtype = call.at(2).at(1).value();
  if (dtype.kind != Kind::Global || dtype.module != "torch")
    field.fail(fmt::format("expected a torch dtype, found {}", dtype.describe()));
  const auto known = dtype_from_torch_name(dtype.name);
  if (!known) field.fail(fmt::format("unsupported dtype torch.{}", dtype.name));
  out.dtype = *known;
  const Field group = state.at(2);
  out.rank = group["global_rank"].as_int();
  out.world_size = group["global_world_size"].as_int();
  if (out.world_size < 1 || out.world_size > (1 << 20) || out.rank < 0 || out.rank >= out.world_size)
    group.fail(fmt::format("rank {} of a world of {}", out.rank, out.world_size));
  const Field shards = metadata["shards_metadata"];
  if (shards.size() > kMaxShards) shards.fail(fmt::format("{} shards", shards.size()));
  for (size_t i = 0; i < shards.size(); ++i) out.shards.push_back(placement_of(shards.at(i)));
  for (const auto n : out.global_size)
    if (n < 0 || n > kMaxElements) metadata.fail(fmt::format("a dimension of {} elements", n));
  check_tiling(metadata, out);
  const Field local = state.at(0);
  for (size_t i = 0; i < local.size(); ++i) {
    const Field shard = local.at(i);
    LocalShard s{placement_of(shard["metadata"]), shard["tensor"].as_tensor()};
    if (std::find(out.shards.begin(), out.shards.end(), s.placement) == out.shards.end())
      shard.fail("a local shard the metadata does not list");
    if (s.placement.rank != out.rank)
      shard.fail(fmt::format("a shard of rank {} in rank {}'s file", s.placement.rank, out.rank));
    if (s.tensor.shape != s.placement.sizes)
      shard.fail(fmt::format("tensor of shape [{}] for a shard of [{}]", fmt::join(s.tensor.shape, ", "),
                             fmt::join(s.placement.sizes, ", ")));
    if (s.tensor.dtype != out.dtype)
      shard.fail(fmt::format("tensor of {} in a ShardedTensor of {}", dtype_torch_name(s.tensor.dtype),
                             dtype_torch_name(out.dtype)));
    out.local.push_back(std::move(s));
  }
  // a rank the metadata places a shard on holds it, once
  const bool placed =
      std::any_of(out.shards.begin(), out.shards.end(), [&](const auto& s) { return s.rank == out.rank; });
  if (out.local.size() != (placed ? 1U : 0U))
    local.fail(fmt::format("rank {} holds {} local shards, the metadata places {} on it", out.rank,
                           out.local.size(), placed ? 1 : 0));
  return out;
}

}  // namespace ckptfs::formats
