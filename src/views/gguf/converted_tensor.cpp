#include "views/gguf/converted_tensor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "views/gguf/gguf_numbers.hpp"
#include "views/gguf/hf_directory.hpp"

namespace ckptfs::views::gguf {

namespace {

void check_dtype(const catalog::LogicalTensor& t) {
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    throw Refusal(fmt::format("tensor {}: dtype {} not followed by ckptfs yet", t.name,
                              dtype_safetensors_name(t.dtype)));
}

// The converter's fallback: Q8_0 quantizes rows of whole 32-element blocks only.
void fall_back_from_q8_0(GgufTensor& g) {
  if (g.type == GgmlType::q8_0 && g.ne[0] % kQ8Block != 0) g.type = GgmlType::f16;
}

}  // namespace

std::vector<size_t> converter_order(const catalog::Catalog& catalog,
                                    const std::vector<std::vector<size_t>>& shards) {
  std::vector<size_t> order;
  for (const auto& shard : shards) {
    const auto from = static_cast<ptrdiff_t>(order.size());
    order.insert(order.end(), shard.begin(), shard.end());
    std::sort(order.begin() + from, order.end(),
              [&](size_t a, size_t b) { return catalog.tensors[a].name < catalog.tensors[b].name; });
  }
  return order;
}

GgufTensor converted_tensor(std::string name, const catalog::TensorRef& tensor, GgmlType out) {
  const auto& t = *tensor;
  check_dtype(t);
  if (t.shape.empty() || t.shape.size() > 2) throw Refusal(fmt::format("tensor {}: not 1-D or 2-D", t.name));
  GgufTensor g{std::move(name), {}, out, SourceRows{tensor, 0}};
  for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) g.ne.push_back(static_cast<uint64_t>(*d));
  if (g.ne.size() <= 1 || g.name.ends_with("_norm.weight") || !g.name.ends_with(".weight") ||
      g.name == "position_embd.weight" || g.name.ends_with(".ffn_gate_inp.weight"))
    g.type = GgmlType::f32;
  fall_back_from_q8_0(g);
  return g;
}

GgufTensor stacked_experts(std::string name, std::vector<catalog::TensorRef> experts, GgmlType out) {
  const auto& first = *experts.front();
  for (const auto& e : experts) {
    check_dtype(*e);
    if (e->shape.size() != 2 || e->shape != first.shape || e->dtype != first.dtype)
      throw Refusal(fmt::format("tensor {}: not 2-D of {}'s shape and dtype (the converter stacks them)",
                                e->name, first.name));
  }
  GgufTensor g{std::move(name),
               {static_cast<uint64_t>(first.shape[1]), static_cast<uint64_t>(first.shape[0]), experts.size()},
               out,
               StackedExperts{std::move(experts)}};
  fall_back_from_q8_0(g);
  return g;
}

}  // namespace ckptfs::views::gguf
