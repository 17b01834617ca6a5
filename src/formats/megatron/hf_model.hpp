// The hf/ view of a Megatron-LM model: Hugging Face names (Llama, Qwen2 when only q/k/v carry biases, Qwen3
// with q/k layernorm, Qwen3-MoE with its experts and dense layers, Qwen2-MoE with
// its gated shared expert, Mixtral, GPT-2), q/k/v split out of the
// fused QKV, gate/up out of fc1, the vocabulary trimmed to the tokenizer's, a config.json built from the
// saved args, and the tokenizer files found beside the checkpoint.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "ckptfs/checkpoint.hpp"
#include "formats/megatron/model_args.hpp"

namespace ckptfs::megatron {

// Adds catalog "hf" and the hf/ extra files to `tag` (whose "model" catalog is the merged model) when the
// model is one Hugging Face can load under these names; otherwise adds a note saying why not.
// `side_files`: files beside the checkpoint (save dir, then iteration dir: a later one wins). `stack_config`:
// the HF config.json a stack saved beside the checkpoint (verl's huggingface/), served as hf/config.json in
// place of the one built from the args. `transpose_cache`: where GPT-2's transposed Conv1D weights keep
// their tiles (OpenOptions::transpose_cache).
void add_hf_view(Tag& tag, const ModelArgs& args,
                 const std::vector<std::vector<std::filesystem::path>>& side_files,
                 const std::optional<std::filesystem::path>& stack_config,
                 const std::shared_ptr<catalog::TransposeCache>& transpose_cache);

}  // namespace ckptfs::megatron
