// A GGUF file (ggml docs/gguf.md, version 3) whose tensor data is computed per read from the source
// tensors: header, key-values and tensor infos held in memory, each tensor's bytes converted (f32, f16,
// bf16, Q8_0 blocks) from the elements of the tensor(s) it is made of, rows permuted or experts stacked where
// llama.cpp's converter does so, each tensor padded with zeros to the 32-byte alignment.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ckptfs/views.hpp"

namespace ckptfs::views::gguf {

enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };

inline constexpr uint64_t kAlignment = 32;  // GGUF's default (the converter never sets general.alignment)

// The rows of a source tensor (F32, F16 or BF16), in order or, with `permute_heads` > 0, in the order of
// the converter's Llama Q/K permutation over that many heads (conversion/llama.py's permute).
struct SourceRows {
  catalog::TensorRef tensor;
  uint64_t permute_heads = 0;
};
// The experts of one MoE layer stacked along a new first dimension (torch.stack of E tensors of one shape,
// conversion/llama.py and qwen.py): expert e's elements follow expert e-1's.
struct StackedExperts {
  std::vector<catalog::TensorRef> experts;
};
// Elements computed at mount (Llama's rope_freqs).
struct ComputedF32 {
  std::vector<float> values;
};
using TensorElements = std::variant<SourceRows, StackedExperts, ComputedF32>;

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> ne;  // GGUF's dimension order: numpy's shape reversed
  GgmlType type = GgmlType::f32;
  TensorElements elements;

  uint64_t numel() const;
  uint64_t nbytes() const;
};

// The file: magic, version 3, counts, `kv_section` then `shared_kv_section` (kv_count entries in all,
// gguf_kv.hpp; the second shared by the files of one model: its tokenizer's keys), the tensor infos, zero
// padding to kAlignment, then the tensors' data, each padded to kAlignment.
VirtualFilePtr make_gguf_file(const std::string& kv_section,
                              std::shared_ptr<const std::string> shared_kv_section, uint64_t kv_count,
                              std::vector<GgufTensor> tensors);

}  // namespace ckptfs::views::gguf
