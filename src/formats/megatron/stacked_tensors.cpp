#include "formats/megatron/stacked_tensors.hpp"

#include <memory>

#include "formats/megatron/fp32_masters.hpp"

namespace ckptfs::megatron {

catalog::LogicalTensor stacked_entry(const catalog::LogicalTensor& stacked, int64_t index, std::string name) {
  std::vector<catalog::Box> boxes;
  catalog::append_slice(boxes, stacked, 0, index, index + 1, 0);
  for (auto& b : boxes) {
    b.offsets.erase(b.offsets.begin());
    b.sizes.erase(b.sizes.begin());
    b.source.shape.erase(b.source.shape.begin());
    b.source.strides.erase(b.source.strides.begin());
  }
  std::vector<int64_t> shape(stacked.shape.begin() + 1, stacked.shape.end());
  return catalog::assembled_tensor(std::move(name), stacked.dtype, std::move(shape), std::move(boxes),
                                   stacked.origin);
}

std::optional<catalog::LogicalTensor> unflatten_fragments(const catalog::LogicalTensor& stored,
                                                          const std::vector<int64_t>& model_shape) {
  const size_t rank = model_shape.size();
  if (rank == 0 || stored.shape.size() != rank + 1 || !std::holds_alternative<catalog::Boxed>(stored.source))
    return std::nullopt;
  std::vector<int64_t> local(rank);
  int64_t numel = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (stored.shape[d] <= 0 || model_shape[d] % stored.shape[d] != 0) return std::nullopt;
    local[d] = model_shape[d] / stored.shape[d];
    numel *= local[d];
  }
  if (numel != stored.shape[rank]) return std::nullopt;
  // One box per fragment, viewing that fragment's flattened shard (itself pieced from the DP ranks' chunks).
  std::vector<catalog::Box> boxes;
  std::vector<int64_t> index(rank, 0);
  for (bool more = numel > 0; more;) {
    catalog::LogicalTensor flat = stored;
    for (size_t d = 0; d < rank; ++d) flat = stacked_entry(flat, index[d], stored.name);
    catalog::Box box;
    for (size_t d = 0; d < rank; ++d) box.offsets.push_back(index[d] * local[d]);
    box.sizes = local;
    auto inner = std::make_shared<const catalog::LogicalTensor>(std::move(flat));
    box.source = flat_view(catalog::element_view(*inner), 0, local);
    box.inner = std::move(inner);
    boxes.push_back(std::move(box));
    more = false;
    for (size_t d = rank; d-- > 0;) {  // the next fragment index, last dimension fastest
      if (++index[d] < stored.shape[d]) {
        more = true;
        break;
      }
      index[d] = 0;
    }
  }
  return catalog::assembled_tensor(stored.name, stored.dtype, model_shape, std::move(boxes), stored.origin);
}

}  // namespace ckptfs::megatron
