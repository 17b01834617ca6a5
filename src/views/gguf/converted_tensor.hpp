// The converter's per-tensor rules shared by the architectures (conversion/base.py prepare_tensors): the
// order it takes a model's tensors in, and the type and shape each is written with.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "views/gguf/gguf_file.hpp"

namespace ckptfs::views::gguf {

// The indices of `catalog`'s tensors in the converter's order when they are saved as `shards` (indices per
// safetensors file, the files in name order): file by file, names in code point order within each.
std::vector<size_t> converter_order(const catalog::Catalog& catalog,
                                    const std::vector<std::vector<size_t>>& shards);

// `tensor` (F32, F16 or BF16, 1-D or 2-D, its rows in order) as GGUF tensor `name` for output type `out`:
// F32 where the converter keeps float32 (1-D tensors, norms, biases, `position_embd.weight`, the MoE router
// `ffn_gate_inp.weight`), F16 for Q8_0 rows not a multiple of 32. Throws Refusal for another dtype or rank.
GgufTensor converted_tensor(std::string name, const catalog::TensorRef& tensor, GgmlType out);

// The 2-D `experts` (one shape and dtype, F32, F16 or BF16) stacked into the 3-D GGUF tensor `name`
// ([experts, rows, cols] in torch's order) for output type `out`, F16 for Q8_0 rows not a multiple of 32.
// Throws Refusal where torch.stack would fail.
GgufTensor stacked_experts(std::string name, std::vector<catalog::TensorRef> experts, GgmlType out);

}  // namespace ckptfs::views::gguf
