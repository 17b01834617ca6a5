// The converter's per-tensor rules shared by the architectures (conversion/base.py prepare_tensors): the
// order it takes a one-shard model's tensors in, and the type and shape each is written with.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "views/gguf/gguf_file.hpp"

namespace ckptfs::views::gguf {

// The indices of `catalog`'s tensors in the converter's order for one safetensors file: names in code
// point order.
std::vector<size_t> converter_order(const catalog::Catalog& catalog);

// `tensor` (F32, F16 or BF16, 1-D or 2-D, its rows in order) as GGUF tensor `name` for output type `out`:
// F32 where the converter keeps float32 (1-D tensors, norms, biases, `position_embd.weight`), F16 for
// Q8_0 rows not a multiple of 32. Throws Refusal for another dtype or rank.
GgufTensor converted_tensor(std::string name, const catalog::TensorRef& tensor, GgmlType out);

}  // namespace ckptfs::views::gguf
