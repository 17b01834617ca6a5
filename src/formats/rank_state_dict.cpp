#include "formats/rank_state_dict.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "ckptfs/error.hpp"
#include "ckptfs/overloaded.hpp"
#include "ckptfs/torch.hpp"
#include "formats/pickle_access.hpp"

namespace ckptfs::formats {

namespace fs = std::filesystem;
using catalog::Box;
using catalog::LogicalTensor;

namespace {

// A DTensor parameter from every rank's shard: the ranks at coordinate 0 of each replicated mesh
// dimension place their local tensors at the box their Shard placements give them.
LogicalTensor merge_dtensor(const std::string& name, const DTensorShard& first,
                            const std::vector<RankStateDict>& ranks) {
  const auto world = static_cast<int64_t>(ranks.size());
  if (mesh_ranks(first.mesh_shape, world) != world)
    ranks[0].fail(name, fmt::format("DTensor mesh {} does not hold the world size of {} ranks",
                                    mesh_string(first.mesh_shape, first.mesh_dim_names), world));
  std::vector<Box> boxes;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto* shard = std::get_if<DTensorShard>(&ranks[r].values.at(name));
    if (shard == nullptr) ranks[r].fail(name, "not a DTensor where rank 0 saved one");
    const DTensorShard& s = *shard;
    if (s.global_shape != first.global_shape || s.placements != first.placements ||
        s.mesh_shape != first.mesh_shape)
      ranks[r].fail(name, fmt::format("DTensor {} {} on mesh {}, rank 0's is {} {} on mesh {}",
                                      fmt::join(s.global_shape, "x"), placement_string(s.placements),
                                      mesh_string(s.mesh_shape, s.mesh_dim_names),
                                      fmt::join(first.global_shape, "x"), placement_string(first.placements),
                                      mesh_string(first.mesh_shape, first.mesh_dim_names)));
    // init_device_mesh numbers ranks row-major: rank r's file holds coordinate r
    const auto coordinate = mesh_coordinate(static_cast<int64_t>(r), s.mesh_shape);
    if (s.coordinate && *s.coordinate != coordinate)
      ranks[r].fail(name, fmt::format("holds the shard of mesh coordinate ({}), but rank {} is at ({})",
                                      fmt::join(*s.coordinate, ", "), r, fmt::join(coordinate, ", ")));
    const LocalBox box = local_box(s.global_shape, s.placements, s.mesh_shape, coordinate);
    if (box.sizes != s.local.shape)
      ranks[r].fail(name, fmt::format("local shard [{}] at mesh coordinate ({}), but {} of [{}] gives [{}] "
                                      "there (shards do not tile)",
                                      fmt::join(s.local.shape, ", "), fmt::join(coordinate, ", "),
                                      placement_string(s.placements), fmt::join(s.global_shape, ", "),
                                      fmt::join(box.sizes, ", ")));
    if (s.local.dtype != first.local.dtype)
      ranks[r].fail(name, fmt::format("local tensor of {}, rank 0's is {}", dtype_torch_name(s.local.dtype),
                                      dtype_torch_name(first.local.dtype)));
    bool replica = false;  // a copy of what the rank at coordinate 0 of a replicated dimension holds
    for (size_t m = 0; m < s.placements.size(); ++m)
      replica = replica || (s.placements[m].replicate && coordinate[m] != 0);
    if (!replica)
      boxes.push_back({.offsets = box.offsets, .sizes = box.sizes, .source = s.local, .inner = nullptr});
  }
  const std::string origin = fmt::format("DTensor {} over mesh {}", placement_string(first.placements),
                                         mesh_string(first.mesh_shape, first.mesh_dim_names));
  try {
    return catalog::assembled_tensor(name, first.local.dtype, first.global_shape, std::move(boxes), origin);
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", ranks[0].file.parent_path().string(), e.what()));
  }
}

}  // namespace

// A plain tensor on every rank: concatenated on dim 0 in rank order, or rank 0's where replicated.
LogicalTensor merge_plain_tensor(const std::string& name, const std::vector<RankStateDict>& ranks,
                                 PlainTensors plain) {
  const auto* first_ptr = std::get_if<torch::SourceTensor>(&ranks[0].values.at(name));
  if (first_ptr == nullptr) ranks[0].fail(name, "expected a plain tensor");
  const torch::SourceTensor& first = *first_ptr;
  if (first.shape.empty() || plain == PlainTensors::replicated) {
    for (const auto& rank : ranks) {
      const auto* t = std::get_if<torch::SourceTensor>(&rank.values.at(name));
      if (t == nullptr || t->shape != first.shape || t->dtype != first.dtype)
        rank.fail(name, fmt::format("not rank 0's {} [{}] (a tensor every rank saves whole)",
                                    dtype_torch_name(first.dtype), fmt::join(first.shape, ", ")));
    }
    return catalog::whole_tensor(name, first, first.dtype, "rank 0's tensor (every rank saves it whole)");
  }
  std::vector<Box> boxes;
  std::vector<int64_t> shape = first.shape;
  shape[0] = 0;
  for (const auto& rank : ranks) {
    const auto* t = std::get_if<torch::SourceTensor>(&rank.values.at(name));
    if (t == nullptr || t->shape.size() != first.shape.size() ||
        !std::equal(t->shape.begin() + 1, t->shape.end(), first.shape.begin() + 1) || t->dtype != first.dtype)
      rank.fail(name, fmt::format("does not concatenate with rank 0's {} [{}] on dim 0",
                                  dtype_torch_name(first.dtype), fmt::join(first.shape, ", ")));
    std::vector<int64_t> offsets(t->shape.size(), 0);
    offsets[0] = shape[0];
    shape[0] += t->shape[0];
    boxes.push_back({.offsets = offsets, .sizes = t->shape, .source = *t, .inner = nullptr});
  }
  return catalog::assembled_tensor(name, first.dtype, shape, std::move(boxes),
                                   "plain tensors concatenated on dim 0");
}

void RankStateDict::fail(const std::string& name, const std::string& problem) const {
  throw FormatError(fmt::format("{}: {}: {}", file.string(), name, problem));
}

bool RankStateDict::holds_distributed_tensors() const {
  return std::any_of(values.begin(), values.end(),
                     [](const auto& v) { return !std::holds_alternative<torch::SourceTensor>(v.second); });
}

RankStateDict read_rank_state_dict(io::FileSet& files, const fs::path& path) {
  const auto archive = torch::TorchArchive::open(files.open(path));
  const Field root = root_field(archive);
  if (!root.is_dict()) root.fail(fmt::format("expected a state dict, found {}", root.value().describe()));
  RankStateDict out{path, {}, {}};
  for (const auto& [name, value] : root.items()) {
    RankValue v;
    if (auto dtensor = as_dtensor(value))
      v = std::move(*dtensor);
    else if (auto sharded = as_sharded_tensor(value))
      v = std::move(*sharded);
    else
      v = value.as_tensor();
    if (!out.values.emplace(name, std::move(v)).second) value.fail("saved twice");
    out.names.push_back(name);
  }
  return out;
}

void check_same_names(const std::vector<RankStateDict>& ranks) {
  const std::set<std::string> names(ranks[0].names.begin(), ranks[0].names.end());
  for (const auto& rank : ranks)
    if (std::set<std::string>(rank.names.begin(), rank.names.end()) != names)
      throw FormatError(fmt::format("{}: holds other parameter names than {}", rank.file.string(),
                                    ranks[0].file.filename().string()));
}

std::shared_ptr<catalog::Catalog> merge_dtensor_ranks(const std::vector<RankStateDict>& ranks,
                                                      PlainTensors plain) {
  check_same_names(ranks);
  auto out = std::make_shared<catalog::Catalog>();
  for (const auto& name : ranks[0].names)
    out->tensors.push_back(std::visit(
        Overloaded{
            [&](const torch::SourceTensor&) { return merge_plain_tensor(name, ranks, plain); },
            [&](const DTensorShard& s) { return merge_dtensor(name, s, ranks); },
            [&](const ShardedTensorValue&) -> LogicalTensor {
              ranks[0].fail(name,
                            "a ShardedTensor (an FSDP1 LOCAL_STATE_DICT flat parameter) among DTensors");
            },
        },
        ranks[0].values.at(name)));
  return out;
}

}  // namespace ckptfs::formats
