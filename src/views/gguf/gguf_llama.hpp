// LlamaForCausalLM and Qwen2ForCausalLM (the same module layout) as llama.cpp's converter writes them
// (conversion/llama.py and qwen.py over conversion/base.py): the architecture's keys and the tensors,
// renamed; Llama's Q/K rows permuted and its rope_freqs for llama3 rope scaling.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "views/gguf/gguf_file.hpp"
#include "views/gguf/gguf_kv.hpp"

namespace ckptfs::views::gguf {

enum class Family { llama, qwen2 };

// config.json as transformers 5.12's LlamaConfig / Qwen2Config reads it (their defaults where a key is
// absent).
struct LlamaConfig {
  Family family = Family::llama;
  bool head_dim_key = true;  // whether the config has head_dim (LlamaConfig always; Qwen2Config when given)
  uint64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, context = 2048, head_dim = 0;
  uint64_t vocab_size = 32000;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  bool llama3_rope = false;  // rope_type llama3: the rope_freqs tensor
  double rope_factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_context = 8192;
};

// Throws Refusal where the converter would write keys ckptfs does not (another rope scaling, is_causal
// false, CodeLlama's or Granite's vocabulary sizes) or fail (a missing size).
LlamaConfig read_llama_config(const nlohmann::json& config, Family family);
// "llama", "qwen2": general.architecture and the keys' prefix.
std::string_view architecture_name(Family family);

// general.file_type's place: the llama.* keys before it, then file_type, then those after it.
void add_llama_parameters(KvList& kv, const LlamaConfig& c, uint32_t file_type);

// The tensors of `hf` (Hugging Face names, in the converter's order) for output type `type` (f32, f16,
// bf16 or q8_0): rope_freqs first where llama3 rope asks for it. Throws Refusal for a tensor the converter
// cannot map, or of a dtype other than F32, F16 and BF16.
std::vector<GgufTensor> llama_tensors(const std::shared_ptr<const catalog::Catalog>& hf, const LlamaConfig& c,
                                      GgmlType type);

}  // namespace ckptfs::views::gguf
