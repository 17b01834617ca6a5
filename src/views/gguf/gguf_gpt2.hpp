// GPT2LMHeadModel as llama.cpp's converter writes it (conversion/gpt2.py): the gpt2.* keys and the tensors,
// renamed, the Conv1D weights transposed to [out, in].
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "views/gguf/gguf_file.hpp"
#include "views/gguf/gguf_kv.hpp"

namespace ckptfs::views::gguf {

struct Gpt2Config {
  uint64_t layers = 0, embedding = 0, heads = 0, context = 0;
  double layer_norm_epsilon = 1e-5;
};

// config.json's n_layer, n_embd, n_head and n_ctx (which the converter reads from the file as is: without it
// it fails, as transformers 5 does not write it), layer_norm_epsilon (GPT2Config's default where absent).
Gpt2Config read_gpt2_config(const nlohmann::json& config);

void add_gpt2_parameters(KvList& kv, const Gpt2Config& c, uint32_t file_type);

// The tensors of `hf`, taken in `order` (the converter's), for output type `type`, the transposed weights
// read through a catalog of their own (catalog::Transposed, their tiles kept in `transpose_cache`). Throws
// Refusal for a tensor the converter cannot map (the attention buffers attn.bias / attn.masked_bias: the
// converter fails on them).
std::vector<GgufTensor> gpt2_tensors(const std::shared_ptr<const catalog::Catalog>& hf,
                                     std::span<const size_t> order, GgmlType type,
                                     const std::shared_ptr<catalog::TransposeCache>& transpose_cache);

}  // namespace ckptfs::views::gguf
