// LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM (one
// module layout) as llama.cpp's converter writes them (conversion/llama.py and qwen.py over
// conversion/base.py): the architecture's keys and the tensors, renamed; the Llama class's (Llama, Mixtral)
// Q/K rows permuted and its rope_freqs for llama3 rope scaling; a MoE layer's experts stacked into one 3-D
// tensor per projection.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "views/gguf/gguf_file.hpp"
#include "views/gguf/gguf_kv.hpp"

namespace ckptfs::views::gguf {

// The converter's model class: LlamaModel (llama, mixtral), Qwen2Model, Qwen3Model, Qwen3MoeModel.
enum class Family { llama, mixtral, qwen2, qwen3, qwen3_moe };

// config.json as transformers 5.12's config class reads it (its defaults where a key is absent).
struct LlamaConfig {
  Family family = Family::llama;
  bool head_dim_key = true;  // whether the config's dict has head_dim (LlamaConfig, Qwen3Config always)
  uint64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, context = 2048, head_dim = 0;
  uint64_t vocab_size = 32000;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  bool llama3_rope = false;  // rope_type llama3: the rope_freqs tensor
  double rope_factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_context = 8192;
  uint64_t experts = 0, experts_used = 0;  // MoE (Mixtral, Qwen3-MoE); 0 for a dense model
  uint64_t expert_intermediate = 0;        // Qwen3-MoE's moe_intermediate_size
};

// Throws Refusal where the converter would write keys ckptfs does not (another rope scaling, is_causal
// false, CodeLlama's or Granite's vocabulary sizes, expert groups or gating functions) or fail (a missing
// size).
LlamaConfig read_llama_config(const nlohmann::json& config, Family family);
// "llama", "qwen2", "qwen3", "qwen3moe": general.architecture and the keys' prefix.
std::string_view architecture_name(Family family);

// general.file_type's place: the keys before it, then file_type, then those after it.
void add_llama_parameters(KvList& kv, const LlamaConfig& c, uint32_t file_type);

// The tensors of `hf` (Hugging Face names), taken in `order` (the converter's), for output type `type` (f32,
// f16, bf16 or q8_0): rope_freqs first where llama3 rope asks for it; a layer's experts stacked where the
// converter stacks them (at its last expert tensor). Throws Refusal for a tensor the converter cannot map,
// experts it cannot stack, or a dtype other than F32, F16 and BF16.
std::vector<GgufTensor> llama_tensors(const std::shared_ptr<const catalog::Catalog>& hf,
                                      std::span<const size_t> order, const LlamaConfig& c, GgmlType type);

}  // namespace ckptfs::views::gguf
