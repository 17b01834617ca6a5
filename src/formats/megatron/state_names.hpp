// Names of a Megatron-LM model chunk's parameters: nested legacy dicts flattened, local layer numbers
// (which restart at 0 on every pipeline stage and virtual chunk) made global, TransformerEngine's fused
// norm names mapped to the local spec's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/pickle_access.hpp"

namespace ckptfs::megatron {

// The leaves of a model state dict in order, nested dicts joined with '.' (legacy
// language_model.encoder...); values that are not tensors (_extra_state: None, BytesIO) included.
std::vector<std::pair<std::string, formats::Field>> flatten_state(const formats::Field& model);

// A name with a layer number: "decoder.layers." + 3 + ".mlp.linear_fc1.weight".
struct LayerName {
  std::string prefix;  // up to and including "layers."
  int64_t index = 0;
  std::string rest;  // from the '.' after the number
};
std::optional<LayerName> parse_layer_name(std::string_view name);

// `name` with its layer number increased by `offset` (unchanged when it has none).
std::string shift_layer(std::string_view name, int64_t offset);

// TransformerEngine's fused norm names (what torch_dist always stores) as the local spec names them:
// self_attention.linear_qkv.layer_norm_weight -> input_layernorm.weight, mlp.linear_fc1.layer_norm_* ->
// pre_mlp_layernorm.*.
std::string local_spec_name(std::string_view name);

bool is_extra_state(std::string_view name);

// A routed expert's parameter (mlp.experts.local_experts.{e}.* or TEGroupedMLP's mlp.experts.*.weight{e});
// shared experts (mlp.shared_experts.*) are not.
bool is_expert(std::string_view name);

// An expert parameter's name with its (local) expert number increased by `offset`.
std::string shift_expert(std::string_view name, int64_t offset);

// The name Megatron gives expert `expert` of a stacked torch_dist expert key's layer: SequentialMLP
// (mlp.experts.local_experts.{e}.linear_fc1.weight) or, with grouped GEMM, TEGroupedMLP
// (mlp.experts.linear_fc1.weight{e}). `layer_name` is "decoder.layers.{l}.mlp.experts.experts.<rest>".
std::string expert_name(std::string_view layer_name, int64_t expert,
                        bool grouped_gemm);  // TransformerEngine / Megatron _extra_state entries

}  // namespace ckptfs::megatron
