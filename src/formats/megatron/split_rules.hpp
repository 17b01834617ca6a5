// Which tensor-parallel split each Megatron-LM parameter has, from its module name (megatron-core and
// legacy naming).
#pragma once

#include <string_view>

#include "formats/megatron/model_args.hpp"
#include "formats/tensor_parallel.hpp"

namespace ckptfs::megatron {

using formats::Split;

// The split of a parameter, from the last module name in `name`.
Split split_of(std::string_view name, const ModelArgs& args);

}  // namespace ckptfs::megatron
