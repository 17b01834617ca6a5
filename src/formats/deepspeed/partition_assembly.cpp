#include "formats/deepspeed/partition_assembly.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ckptfs/error.hpp"

namespace ckptfs::deepspeed {

using catalog::LogicalTensor;

namespace {

std::string file_name(const std::filesystem::path& p) {
  return p.filename().string();
}

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

// The elements of a group's params together; each param is below 2^63, their sum need not be.
uint64_t add_numel(uint64_t total, uint64_t numel, const std::filesystem::path& shapes_file, size_t group) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(total, numel, &sum))
    throw FormatError(fmt::format("{}: param_shapes of group {} add up to more than 2^64 elements",
                                  shapes_file.string(), group));
  return sum;
}

// A param served over the flat runs gathered for it from the rank partitions.
LogicalTensor param_tensor(const NamedShape& param, DType dtype, std::vector<catalog::Piece> runs,
                           std::string origin) {
  return {.name = param.name,
          .dtype = dtype,
          .shape = param.shape,
          .source = catalog::FlatRuns{std::move(runs)},
          .origin = std::move(origin)};
}

}  // namespace

NamedIndex index_named(const std::optional<std::vector<NamedTensor>>& tensors) {
  NamedIndex index;
  if (tensors)
    for (const auto& t : *tensors) index.emplace(t.name, &t);
  return index;
}

const NamedTensor* find_named(const NamedIndex& index, std::string_view name) {
  auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

DType fp32_view_dtype(DType d) {
  return (d == DType::F16 || d == DType::BF16) ? DType::F32 : d;
}

namespace {

// fp32 masters are served in F32 whatever they are stored in; optimizer state keeps its stored dtype.
DType served_dtype(const std::string& key, const torch::SourceTensor& stored) {
  return key == "fp32" ? DType::F32 : stored.dtype;
}

// The optimizer-state tensor `key` of group g in one rank's file; FormatError when absent.
const torch::SourceTensor& state_tensor(const OptimStates& rank, size_t g, const std::string& key) {
  auto it = rank.group_state.find(static_cast<int64_t>(g));
  if (it != rank.group_state.end())
    for (const auto& t : it->second)
      if (t.name == key) return t.tensor;
  throw FormatError(fmt::format("{}: optimizer state of group {} has no '{}'", rank.path.string(), g, key));
}

// A stored partition must hold at least the elements of the params it covers (`needed`).
void require_stored(const OptimStates& rank, size_t g, const std::string& key, uint64_t stored,
                    uint64_t needed) {
  if (stored < needed)
    throw FormatError(fmt::format("{}: {} partition of group {} holds {} elements, expected at least {}",
                                  rank.path.string(), key, g, stored, needed));
}

// ZeRO-1/2 and BF16_Optimizer: each rank owns slice[g] consecutive elements of group g's flat buffer.
std::vector<LogicalTensor> lay_out_flat_groups(const ModelStates& shapes_file,
                                               const std::vector<OptimStates>& ranks,
                                               const std::vector<uint64_t>& slices, const std::string& key) {
  const auto& groups = *shapes_file.param_shapes;
  const uint64_t n_ranks = ranks.size();
  std::vector<LogicalTensor> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const uint64_t slice = slices[g];
    uint64_t total = 0;
    for (const auto& p : groups[g]) total += p.numel;
    std::vector<const torch::SourceTensor*> parts;
    for (uint64_t r = 0; r < n_ranks; ++r) {
      parts.push_back(key == "fp32" ? &ranks[r].fp32_groups[g] : &state_tensor(ranks[r], g, key));
      const uint64_t needed = r * slice < total ? std::min(slice, total - r * slice) : 0;
      require_stored(ranks[r], g, key, parts.back()->numel(), needed);
    }
    uint64_t offset = 0;
    for (const auto& param : groups[g]) {
      std::vector<catalog::Piece> runs;
      for (uint64_t e = offset; e < offset + param.numel;) {
        const uint64_t r = e / slice;
        const uint64_t local = e - r * slice;
        const uint64_t count = std::min(offset + param.numel - e, slice - local);
        catalog::append_source_range(runs, e - offset, *parts[r], local, count);
        e += count;
      }
      out.push_back(param_tensor(param, served_dtype(key, *parts.front()), std::move(runs),
                                 fmt::format("{} group {} [{}, {}) over {} rank partitions", key, g, offset,
                                             offset + param.numel, n_ranks)));
      offset += param.numel;
    }
  }
  return out;
}

// ZeRO-3: rank r holds ceil(numel / ranks) elements of every param of sub-group i, one after another.
std::vector<LogicalTensor> lay_out_zero3_groups(const ModelStates& shapes_file,
                                                const std::vector<OptimStates>& ranks,
                                                const std::string& key) {
  const auto& groups = *shapes_file.param_shapes;
  const uint64_t n_ranks = ranks.size();
  std::vector<LogicalTensor> out;
  for (size_t i = 0; i < groups.size(); ++i) {
    uint64_t partition_total = 0;
    for (const auto& p : groups[i])
      partition_total = add_numel(partition_total, ceil_div(p.numel, n_ranks), shapes_file.path, i);
    std::vector<const torch::SourceTensor*> parts;
    for (const auto& rank : ranks) {
      parts.push_back(key == "fp32" ? &rank.fp32_groups[i] : &state_tensor(rank, i, key));
      require_stored(rank, i, key, parts.back()->numel(), partition_total);
    }
    uint64_t offset = 0;
    for (const auto& param : groups[i]) {
      const uint64_t part = ceil_div(param.numel, n_ranks);
      std::vector<catalog::Piece> runs;
      for (uint64_t r = 0; r < n_ranks && r * part < param.numel; ++r) {
        const uint64_t count = std::min(part, param.numel - r * part);
        catalog::append_source_range(runs, r * part, *parts[r], offset, count);
      }
      out.push_back(param_tensor(param, served_dtype(key, *parts.front()), std::move(runs),
                                 fmt::format("{} sub-group {} offset {}, {} per rank over {} ranks", key, i,
                                             offset, part, n_ranks)));
      offset += part;
    }
  }
  return out;
}

std::vector<uint64_t> flat_group_slices(const ModelStates& shapes_file,
                                        const std::vector<OptimStates>& ranks) {
  const auto& groups = *shapes_file.param_shapes;
  const OptimStates& first = ranks.front();
  if (groups.size() != first.fp32_groups.size())
    throw FormatError(fmt::format("{}: param_shapes lists {} parameter groups but {} holds {}",
                                  shapes_file.path.string(), groups.size(), file_name(first.path),
                                  first.fp32_groups.size()));
  const uint64_t n_ranks = ranks.size();
  std::vector<uint64_t> slices;
  for (size_t g = 0; g < groups.size(); ++g) {
    uint64_t total = 0;
    for (const auto& p : groups[g]) total = add_numel(total, p.numel, shapes_file.path, g);
    // Every rank owns an equal slice of the flat group padded for alignment (2 x world size). Rank 0
    // stores its whole slice, padding included; ZeRO-1/2 cut the padding off the last rank's slice,
    // BF16_Optimizer keeps it (so one rank's slice can hold more elements than its params).
    const uint64_t slice = std::max<uint64_t>(first.fp32_groups[g].numel(), 1);
    if (slice < ceil_div(total, n_ranks))
      throw FormatError(
          fmt::format("{}: param_shapes of group {} needs {} elements but the {} optimizer partitions "
                      "hold {} ({} each): shapes do not add up",
                      shapes_file.path.string(), g, total, n_ranks, slice * n_ranks, slice));
    for (uint64_t r = 0; r < n_ranks; ++r) {
      if (ranks[r].fp32_groups.size() <= g)
        throw FormatError(fmt::format("{}: has no fp32 partition for group {}", ranks[r].path.string(), g));
      const uint64_t stored = ranks[r].fp32_groups[g].numel();
      const uint64_t needed = r == 0 || slice <= total / r ? std::min(slice, total - r * slice) : 0;
      if (stored > slice || stored < needed)
        throw FormatError(
            fmt::format("{}: fp32 partition of group {} holds {} elements, expected {} (rank {} of {})",
                        ranks[r].path.string(), g, stored, needed == slice ? slice : needed, r, n_ranks));
    }
    slices.push_back(slice);
  }
  return slices;
}

}  // namespace

std::vector<LogicalTensor> assemble_flat_groups(const ModelStates& shapes_file,
                                                const std::vector<OptimStates>& ranks) {
  return lay_out_flat_groups(shapes_file, ranks, flat_group_slices(shapes_file, ranks), "fp32");
}

std::vector<LogicalTensor> assemble_flat_state(const ModelStates& shapes_file,
                                               const std::vector<OptimStates>& ranks,
                                               const std::string& key) {
  return lay_out_flat_groups(shapes_file, ranks, flat_group_slices(shapes_file, ranks), key);
}

std::vector<LogicalTensor> assemble_zero3_groups(const ModelStates& shapes_file,
                                                 const std::vector<OptimStates>& ranks) {
  const auto& groups = *shapes_file.param_shapes;
  for (const auto& rank : ranks)
    if (rank.fp32_groups.size() != groups.size())
      throw FormatError(fmt::format("{}: holds {} fp32 sub-groups but {} lists {} in param_shapes",
                                    rank.path.string(), rank.fp32_groups.size(), file_name(shapes_file.path),
                                    groups.size()));
  return lay_out_zero3_groups(shapes_file, ranks, "fp32");
}

std::vector<LogicalTensor> assemble_zero3_state(const ModelStates& shapes_file,
                                                const std::vector<OptimStates>& ranks,
                                                const std::string& key) {
  return lay_out_zero3_groups(shapes_file, ranks, key);
}

std::vector<LogicalTensor> assemble_zero3_frozen(const std::vector<ModelStates>& ranks) {
  std::vector<LogicalTensor> out;
  const ModelStates& first = ranks.front();
  if (!first.frozen_param_shapes) return out;
  const uint64_t n_ranks = ranks.size();
  std::vector<NamedIndex> fragments;
  for (const auto& rank : ranks) fragments.push_back(index_named(rank.frozen_param_fragments));
  for (const auto& param : *first.frozen_param_shapes) {
    const uint64_t part = ceil_div(param.numel, n_ranks);
    DType dtype = DType::F32;
    std::vector<catalog::Piece> runs;
    for (uint64_t r = 0; r < n_ranks; ++r) {
      const NamedTensor* frag = find_named(fragments[r], param.name);
      if (frag == nullptr)
        throw FormatError(fmt::format("{}: frozen_param_fragments has no entry for {}",
                                      ranks[r].path.string(), param.name));
      if (r == 0) dtype = frag->tensor.dtype;
      if (r * part >= param.numel) continue;
      const uint64_t count = std::min(part, param.numel - r * part);
      catalog::append_source_range(runs, r * part, frag->tensor, 0, count);
    }
    out.push_back(param_tensor(param, dtype, std::move(runs),
                               fmt::format("frozen, {} per rank over {} ranks", part, n_ranks)));
  }
  return out;
}

}  // namespace ckptfs::deepspeed
