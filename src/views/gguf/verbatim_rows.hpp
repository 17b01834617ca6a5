// Tensor data that is the source's own bytes: the output type is the source's dtype, so the converter's
// widening to float32 and narrowing back (gguf-py over numpy) leaves each element as it was, except a BF16
// NaN, which it quiets. Such data is read as row ranges of the source (in order, or in Llama's Q/K-permuted
// order) instead of element by element: the bf16/f16/f32 files of a model of that dtype read at close to
// the speed of its model.safetensors.
#pragma once

#include <cstdint>
#include <span>

#include "views/gguf/gguf_file.hpp"

namespace ckptfs::views::gguf {

// The source row that row `row` of a tensor of `rows` rows comes from under the converter's Llama Q/K
// permutation over `heads` heads (conversion/llama.py permute): out row h*hd + 2i + j is source row
// h*hd + j*hd/2 + i.
uint64_t permuted_source_row(uint64_t row, uint64_t rows, uint64_t heads);

// The source rows of `t` when its data is their bytes (SourceRows of the output type's dtype), else null.
const SourceRows* verbatim_rows(const GgufTensor& t);

// Bytes [offset, offset + dst.size()) of the data of `t`, whose verbatim_rows are `rows`.
void read_verbatim(const GgufTensor& t, const SourceRows& rows, uint64_t offset, std::span<std::byte> dst);

}  // namespace ckptfs::views::gguf
