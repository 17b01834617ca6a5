// ZeRO-0 with DeepSpeed's FP16_UnfusedOptimizer (bf16 without ZeRO or pipeline since DeepSpeed 0.17.6; fp16 with
// unfused optimizers): no optimizer files, and the fp32 masters sit unnamed in the model-state file's
// optimizer['fp32_groups'] (docs/formats/deepspeed.md: ZeRO-0 with FP16_UnfusedOptimizer).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/deepspeed/state_files.hpp"

namespace ckptfs::deepspeed {

struct UnfusedMasters {
  std::vector<catalog::LogicalTensor> trainable;                  // fp32 masters in fp32_groups order
  std::vector<std::pair<std::string, std::string>> aliases;       // tied entries of `module`: alias -> owner
};

// Names the masters of `ms.unfused_fp32_groups`. FP16_UnfusedOptimizer keeps, per param group, the params
// that require grad in group order. Groups made from module.parameters() (DeepSpeed's default, or HF
// Trainer's decay / no-decay filters) list their params in `module` order, which holds them without
// buffers, tied repeats (entries sharing an earlier entry's storage) and frozen params. Frozen params are
// not marked in the file: each group's masters are matched by shape, in order, to the parameters earlier
// groups left, and the match must be the only one possible. Throws FormatError when no order-keeping match
// exists (groups in another order) and UnsupportedError when several do (a frozen param beside a trainable
// one of the same shape), naming the file.
UnfusedMasters name_unfused_masters(const ModelStates& ms);

}  // namespace ckptfs::deepspeed
