#include "formats/tensor_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

}  // namespace

std::optional<size_t> differing_replica(const std::string& name, const std::vector<RankTensor>& ranks,
                                        uint64_t max_bytes) {
  const auto& first = ranks.front().tensor;
  if (ranks.size() < 2 || first.numel() * dtype_size(first.dtype) > max_bytes) return std::nullopt;
  const auto reference = rank_bytes(name, ranks.front());
  for (size_t r = 1; r < ranks.size(); ++r)
    if (rank_bytes(name, ranks[r]) != reference) return r;
  return std::nullopt;
}

catalog::LogicalTensor merge_tensor_parallel(const std::string& name, Split split,
                                             const std::vector<RankTensor>& ranks, DType dtype) {
  const auto& shape = ranks.front().tensor.shape;
  const auto fail = [&](const std::string& what) -> void {
    throw FormatError(fmt::format("{}: tensor {}: {}", ranks.front().file.string(), name, what));
  };
  for (const auto& r : ranks)
    if (r.tensor.shape != shape)
      fail(fmt::format("shape [{}] on TP rank 0, [{}] in {}", fmt::join(shape, ", "), fmt::join(r.tensor.shape, ", "),
                       r.file.string()));
  const int64_t tp = static_cast<int64_t>(ranks.size());
  std::vector<int64_t> full = shape;
  std::vector<catalog::Box> boxes;
  const auto place = [&](const RankTensor& rank, const torch::SourceTensor& src, std::vector<int64_t> offsets) {
    boxes.push_back({.offsets = std::move(offsets), .sizes = src.shape, .source = src, .inner = rank.inner});
  };
  const std::vector<int64_t> origin(shape.size(), 0);
  switch (split) {
    case Split::Replicated:
      place(ranks.front(), ranks.front().tensor, origin);
      break;
    case Split::Rows:
    case Split::GatedRows: {
      if (shape.empty()) fail("a 0-d tensor cannot be split over ranks");
      const bool gated = split == Split::GatedRows;
      if (gated && shape[0] % 2 != 0) fail(fmt::format("a gated (SwiGLU) fc1 with an odd row count {}", shape[0]));
      const int64_t part = gated ? shape[0] / 2 : shape[0];  // rows of one half held by one rank
      full[0] = shape[0] * tp;
      for (int64_t r = 0; r < tp; ++r) {
        const auto& src = ranks[r].tensor;
        for (int64_t half = 0; half < (gated ? 2 : 1); ++half) {
          std::vector<int64_t> at = origin;
          at[0] = half * part * tp + r * part;
          place(ranks[r], catalog::narrow(src, 0, half * part, part), at);
        }
      }
      break;
    }
    case Split::Columns:
      if (shape.size() < 2) fail("a row-parallel weight with fewer than 2 dimensions");
      full[1] = shape[1] * tp;
      for (int64_t r = 0; r < tp; ++r) {
        std::vector<int64_t> at = origin;
        at[1] = r * shape[1];
        place(ranks[r], ranks[r].tensor, at);
      }
      break;
  }
  const std::string origin_text =
      split == Split::Replicated ? "TP rank 0" : fmt::format("{} TP ranks{}", tp, split == Split::GatedRows ? ", gated" : "");
  return catalog::assembled_tensor(name, dtype, std::move(full), std::move(boxes), origin_text);
}

}  // namespace ckptfs::formats
