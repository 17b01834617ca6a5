#include "views/gguf/converted_tensor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "views/gguf/gguf_numbers.hpp"
#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

std::vector<size_t> converter_order(const catalog::Catalog& catalog) {
  std::vector<size_t> order(catalog.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return catalog.tensors[a].name < catalog.tensors[b].name; });
  return order;
}

GgufTensor converted_tensor(std::string name, const catalog::TensorRef& tensor, GgmlType out) {
  const auto& t = *tensor;
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    throw Refusal(fmt::format("tensor {}: dtype {} not followed by ckptfs yet", t.name,
                              dtype_safetensors_name(t.dtype)));
  if (t.shape.empty() || t.shape.size() > 2) throw Refusal(fmt::format("tensor {}: not 1-D or 2-D", t.name));
  GgufTensor g{std::move(name), {}, out, SourceRows{tensor, 0}};
  for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) g.ne.push_back(static_cast<uint64_t>(*d));
  if (g.ne.size() <= 1 || g.name.ends_with("_norm.weight") || !g.name.ends_with(".weight") ||
      g.name == "position_embd.weight")
    g.type = GgmlType::f32;
  if (g.type == GgmlType::q8_0 && g.ne[0] % kQ8Block != 0)
    g.type = GgmlType::f16;  // the converter's fallback
  return g;
}

}  // namespace ckptfs::views::gguf
