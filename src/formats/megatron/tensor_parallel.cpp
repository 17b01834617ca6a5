#include "formats/megatron/tensor_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ckptfs/error.hpp"

namespace ckptfs::megatron {

namespace {

// "decoder.layers.3.mlp.linear_fc1.weight" -> "linear_fc1"
std::string_view module_of(std::string_view name) {
  const size_t last = name.rfind('.');
  if (last == std::string_view::npos) return name;
  const std::string_view owner = name.substr(0, last);
  const size_t dot = owner.rfind('.');
  return dot == std::string_view::npos ? owner : owner.substr(dot + 1);
}

// "weight" of "...linear_fc1.weight" and of TEGroupedMLP's "...linear_fc1.weight3"
std::string_view leaf_of(std::string_view name) {
  const size_t last = name.rfind('.');
  std::string_view leaf = last == std::string_view::npos ? name : name.substr(last + 1);
  while (!leaf.empty() && leaf.back() >= '0' && leaf.back() <= '9') leaf.remove_suffix(1);
  return leaf;
}

}  // namespace

Split split_of(std::string_view name, const ModelArgs& args) {
  const std::string_view module = module_of(name);
  const std::string_view leaf = leaf_of(name);
  if (leaf != "weight" && leaf != "bias") return Split::Replicated;  // TE's layer_norm_weight / _bias
  if (module == "word_embeddings" || module == "output_layer" || module == "word_embeddings_for_head" ||
      module == "linear_qkv" || module == "query_key_value")
    return Split::Rows;
  if (module == "linear_fc1" || module == "dense_h_to_4h") return args.swiglu ? Split::GatedRows : Split::Rows;
  if (leaf == "weight" && (module == "linear_proj" || module == "linear_fc2" || module == "dense" ||
                           module == "dense_4h_to_h"))
    return Split::Columns;
  return Split::Replicated;
}

catalog::LogicalTensor merge_tensor_parallel(const std::string& name, Split split,
                                             const std::vector<RankTensor>& ranks, DType dtype) {
  const auto& shape = ranks.front().tensor->shape;
  const auto fail = [&](const std::string& what) -> void {
    throw FormatError(fmt::format("{}: tensor {}: {}", ranks.front().file.string(), name, what));
  };
  for (const auto& r : ranks)
    if (r.tensor->shape != shape)
      fail(fmt::format("shape [{}] on TP rank 0, [{}] in {}", fmt::join(shape, ", "), fmt::join(r.tensor->shape, ", "),
                       r.file.string()));
  const int64_t tp = static_cast<int64_t>(ranks.size());
  std::vector<int64_t> full = shape;
  std::vector<catalog::Box> boxes;
  const auto place = [&](const torch::SourceTensor& src, std::vector<int64_t> offsets) {
    boxes.push_back({std::move(offsets), src.shape, src});
  };
  const std::vector<int64_t> origin(shape.size(), 0);
  switch (split) {
    case Split::Replicated:
      place(*ranks.front().tensor, origin);
      break;
    case Split::Rows:
    case Split::GatedRows: {
      if (shape.empty()) fail("a 0-d tensor cannot be split over ranks");
      const bool gated = split == Split::GatedRows;
      if (gated && shape[0] % 2 != 0) fail(fmt::format("a gated (SwiGLU) fc1 with an odd row count {}", shape[0]));
      const int64_t part = gated ? shape[0] / 2 : shape[0];  // rows of one half held by one rank
      full[0] = shape[0] * tp;
      for (int64_t r = 0; r < tp; ++r) {
        const auto& src = *ranks[r].tensor;
        for (int64_t half = 0; half < (gated ? 2 : 1); ++half) {
          std::vector<int64_t> at = origin;
          at[0] = half * part * tp + r * part;
          place(catalog::narrow(src, 0, half * part, part), at);
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
        place(*ranks[r].tensor, at);
      }
      break;
  }
  const std::string origin_text =
      split == Split::Replicated ? "TP rank 0" : fmt::format("{} TP ranks{}", tp, split == Split::GatedRows ? ", gated" : "");
  return catalog::assembled_tensor(name, dtype, std::move(full), std::move(boxes), origin_text);
}

}  // namespace ckptfs::megatron
