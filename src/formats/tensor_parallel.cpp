#include "formats/tensor_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "ckptfs/error.hpp"

namespace ckptfs::formats {

RankTensor rank_tensor(const torch::SourceTensor& tensor, std::filesystem::path file) {
  return {tensor, nullptr, std::move(file)};
}

RankTensor rank_tensor(std::shared_ptr<const catalog::LogicalTensor> tensor, std::filesystem::path file) {
  torch::SourceTensor view = catalog::element_view(*tensor);
  return {std::move(view), std::move(tensor), std::move(file)};
}

namespace {

std::vector<std::byte> rank_bytes(const std::string& name, const RankTensor& rank) {
  const catalog::LogicalTensor whole =
      rank.inner ? *rank.inner : catalog::whole_tensor(name, rank.tensor, rank.tensor.dtype, "");
  std::vector<std::byte> out(whole.nbytes());
  catalog::read_tensor(whole, 0, out);
  return out;
}

// The first rank whose copy of a replicated parameter differs from rank 0's, comparing the bytes only
// when the tensor is at most 1 MiB (norms and biases; a weight matrix is never compared).
std::optional<size_t> differing_replica(const std::string& name, const std::vector<RankTensor>& ranks) {
  constexpr uint64_t kMaxCompared = uint64_t{1} << 20;
  const auto& first = ranks.front().tensor;
  if (ranks.size() < 2 || first.numel() * dtype_size(first.dtype) > kMaxCompared) return std::nullopt;
  const auto reference = rank_bytes(name, ranks.front());
  for (size_t r = 1; r < ranks.size(); ++r)
    if (rank_bytes(name, ranks[r]) != reference) return r;
  return std::nullopt;
}

// Every sub-parameter whole: the ranks' pieces of it one after another, the sub-parameters in order.
catalog::LogicalTensor merge_sub_params(const std::string& name, const std::vector<RankTensor>& ranks,
                                        const SubParams& layout, DType dtype, std::string origin) {
  std::vector<catalog::Box> boxes;
  std::vector<int64_t> shape = ranks.front().tensor.shape;
  shape[layout.dim] = 0;
  for (int64_t size : layout.sizes) shape[layout.dim] += size;
  std::vector<int64_t> held(ranks.size(), 0);  // where each rank's next piece starts
  int64_t at = 0;
  for (size_t s = 0; s < layout.sizes.size(); ++s)
    for (size_t r = 0; r < ranks.size(); ++r) {
      const int64_t w = layout.widths[s][r];
      torch::SourceTensor piece = catalog::narrow(ranks[r].tensor, layout.dim, held[r], w);
      std::vector<int64_t> offsets(shape.size(), 0);
      offsets[layout.dim] = at;
      boxes.push_back(
          {.offsets = offsets, .sizes = piece.shape, .source = std::move(piece), .inner = ranks[r].inner});
      held[r] += w;
      at += w;
    }
  return catalog::assembled_tensor(name, dtype, std::move(shape), std::move(boxes), std::move(origin));
}

[[noreturn]] void fail(const std::string& name, const std::vector<RankTensor>& ranks,
                       const std::string& what) {
  throw FormatError(fmt::format("{}: tensor {}: {}", ranks.front().file.string(), name, what));
}

void check_same_shape(const std::string& name, const std::vector<RankTensor>& ranks) {
  const auto& shape = ranks.front().tensor.shape;
  for (const auto& r : ranks)
    if (r.tensor.shape != shape)
      fail(name, ranks,
           fmt::format("shape [{}] on TP rank 0, [{}] in {}", fmt::join(shape, ", "),
                       fmt::join(r.tensor.shape, ", "), r.file.string()));
}

// The even split a Split other than Replicated stands for, over ranks of one shape.
SubParams even_split(const std::string& name, Split split, const std::vector<RankTensor>& ranks) {
  const auto& shape = ranks.front().tensor.shape;
  const auto fail = [&](const std::string& what) { formats::fail(name, ranks, what); };
  SubParams out;
  size_t count = 1;
  if (split == Split::Columns) {
    if (shape.size() < 2) fail("a row-parallel weight with fewer than 2 dimensions");
    out.dim = 1;
  } else {
    if (shape.empty()) fail("a 0-d tensor cannot be split over ranks");
    if (split == Split::GatedRows && shape[0] % 2 != 0)
      fail(fmt::format("a gated (SwiGLU) fc1 with an odd row count {}", shape[0]));
    count = split == Split::GatedRows ? 2 : 1;
  }
  const int64_t part =
      shape[out.dim] / static_cast<int64_t>(count);  // of one sub-parameter, held by one rank
  out.sizes.assign(count, part * static_cast<int64_t>(ranks.size()));
  out.widths.assign(count, std::vector<int64_t>(ranks.size(), part));
  return out;
}

}  // namespace

catalog::LogicalTensor merge_tensor_parallel(const std::string& name, const TensorParallelRule& rule,
                                             const std::vector<RankTensor>& ranks, DType dtype,
                                             std::vector<std::string>* notes, const std::string& what) {
  if (const auto* sub = std::get_if<SubParams>(&rule))
    return merge_sub_params(name, ranks, *sub, dtype,
                            fmt::format("{} TP ranks, {} sub-parameters", ranks.size(), sub->sizes.size()));
  const Split split = std::get<Split>(rule);
  check_same_shape(name, ranks);
  if (split == Split::Replicated) {
    if (auto r = notes ? differing_replica(name, ranks) : std::nullopt)
      notes->push_back(
          fmt::format("{} is replicated over TP ranks but differs between {} and {}: TP rank 0's copy "
                      "is served",
                      what, ranks.front().file.string(), ranks[*r].file.string()));
    const auto& first = ranks.front().tensor;
    return catalog::assembled_tensor(
        name, dtype, first.shape,
        {{std::vector<int64_t>(first.shape.size(), 0), first.shape, first, ranks.front().inner}},
        "TP rank 0");
  }
  const std::string origin =
      fmt::format("{} TP ranks{}", ranks.size(), split == Split::GatedRows ? ", gated" : "");
  return merge_sub_params(name, ranks, even_split(name, split, ranks), dtype, origin);
}

}  // namespace ckptfs::formats
