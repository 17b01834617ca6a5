#include "formats/fsdp/flat_units.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include "ckptfs/error.hpp"

namespace ckptfs::formats::fsdp {

namespace {

// A rank's non-empty plain 1-D tensors by the storage they view (file, byte offset): the candidates for
// use_orig_params pieces, indexed once per rank rather than scanned once per unit.
using StorageKey = std::pair<const io::File*, uint64_t>;
using PlainViews = std::multimap<StorageKey, std::pair<const std::string*, const torch::SourceTensor*>>;

PlainViews plain_views(const RankStateDict& rank) {
  PlainViews out;
  for (const auto& [name, value] : rank.values)
    if (const auto* t = std::get_if<torch::SourceTensor>(&value);
        t && t->shape.size() == 1 && t->shape[0] > 0)
      out.emplace(StorageKey{t->storage.file.get(), t->storage.offset}, std::pair{&name, t});
  return out;
}

// The tensors of `views` that lie inside `chunk` (a view of its storage), placed in the flat parameter
// (chunk `begin`).
void find_pieces(const PlainViews& views, const torch::SourceTensor& chunk, int64_t begin,
                 std::vector<OrigPiece>& out) {
  const auto [from, to] = views.equal_range(StorageKey{chunk.storage.file.get(), chunk.storage.offset});
  for (auto it = from; it != to; ++it) {
    const auto& [name, t] = it->second;
    if (t->storage_offset < chunk.storage_offset ||
        t->storage_offset + t->shape[0] > chunk.storage_offset + static_cast<int64_t>(chunk.numel()))
      continue;
    out.push_back({*name, begin + t->storage_offset - chunk.storage_offset, t->shape[0]});
  }
}

}  // namespace

bool is_flat_param_key(std::string_view key) {
  return key == kFlatParamKey ||
         (key.ends_with(kFlatParamKey) && key[key.size() - kFlatParamKey.size() - 1] == '.');
}

std::vector<FlatUnit> gather_flat_units(const std::vector<RankStateDict>& ranks) {
  const auto world = static_cast<int64_t>(ranks.size());
  std::vector<PlainViews> views;
  for (const auto& rank : ranks) views.push_back(plain_views(rank));
  std::vector<FlatUnit> out;
  for (const auto& key : ranks[0].names) {
    if (!is_flat_param_key(key)) continue;
    FlatUnit unit;
    unit.key = key;
    unit.module =
        key.size() > kFlatParamKey.size() ? key.substr(0, key.size() - kFlatParamKey.size() - 1) : "";
    const ShardedTensorValue* first = nullptr;
    for (int64_t r = 0; r < world; ++r) {
      const auto& rank = ranks[static_cast<size_t>(r)];
      const auto found = rank.values.find(key);
      if (found == rank.values.end()) rank.fail(key, "missing (rank 0's file has this FSDP unit)");
      const auto* t = std::get_if<ShardedTensorValue>(&found->second);
      if (t == nullptr) rank.fail(key, "a flat parameter that is no ShardedTensor");
      if (t->rank != r || t->world_size != world)
        rank.fail(key, fmt::format("saved by rank {} of a world of {}, but it is rank {}'s file of {}",
                                   t->rank, t->world_size, r, world));
      if (t->global_size.size() != 1) rank.fail(key, "a flat parameter of more than one dimension");
      if (first == nullptr) {
        first = t;
        unit.dtype = t->dtype;
        unit.numel = t->global_size[0];
      } else if (t->dtype != first->dtype || t->global_size != first->global_size ||
                 t->shards != first->shards) {
        rank.fail(key,
                  fmt::format("a ShardedTensor of {} [{}] in {} shards, rank 0's is {} [{}] in {}",
                              dtype_torch_name(t->dtype), t->global_size[0], t->shards.size(),
                              dtype_torch_name(first->dtype), first->global_size[0], first->shards.size()));
      }
      for (const auto& local : t->local) {
        unit.chunks.emplace_back(local.placement.offsets[0], local.tensor);
        find_pieces(views[static_cast<size_t>(r)], local.tensor, local.placement.offsets[0], unit.pieces);
      }
    }
    // each rank's file holds the shard the metadata places on it (as_sharded_tensor), so the chunks are
    // exactly the metadata's, which tile [0, numel)
    std::sort(unit.chunks.begin(), unit.chunks.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    out.push_back(std::move(unit));
  }
  if (out.empty())
    throw FormatError(
        fmt::format("{}: ShardedTensors under no FSDP flat-parameter key (<module>._flat_param): not "
                    "an FSDP1 LOCAL_STATE_DICT save",
                    ranks[0].file.string()));
  return out;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

catalog::LogicalTensor flat_slice(const FlatUnit& unit, std::string name, std::vector<int64_t> shape,
                                  int64_t first, std::string origin) {
  const int64_t count = shape_numel(shape);
  if (first < 0 || count < 0 || first + count > unit.numel)
    throw FormatError(fmt::format("{}: elements [{}, {}) of a flat parameter of {}", unit.key, first,
                                  first + count, unit.numel));
  catalog::FlatRuns runs;
  for (const auto& [begin, chunk] : unit.chunks) {
    const int64_t end = begin + static_cast<int64_t>(chunk.numel());
    const int64_t from = std::max(begin, first), to = std::min(end, first + count);
    if (from < to)
      catalog::append_source_range(runs.pieces, static_cast<uint64_t>(from - first), chunk,
                                   static_cast<uint64_t>(from - begin), static_cast<uint64_t>(to - from));
  }
  catalog::LogicalTensor t;
  t.name = std::move(name);
  t.dtype = unit.dtype;
  t.shape = std::move(shape);
  t.source = std::move(runs);
  t.origin = std::move(origin);
  catalog::validate(t);
  return t;
}

}  // namespace ckptfs::formats::fsdp
