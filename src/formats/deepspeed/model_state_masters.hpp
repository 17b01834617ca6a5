// ZeRO-0 with DeepSpeed's FP16_Optimizer or FP16_UnfusedOptimizer (fp16; bf16 without ZeRO or pipeline since
// DeepSpeed 0.17.6): no optimizer files, and the fp32 masters sit unnamed in the model-state file's
// `optimizer` (docs/formats/deepspeed.md: "ZeRO-0 with FP16_UnfusedOptimizer", "ZeRO-0 with FP16_Optimizer").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ckptfs/catalog.hpp"
#include "formats/deepspeed/state_files.hpp"

namespace ckptfs::deepspeed {

struct ModelStateMasters {
  std::vector<catalog::LogicalTensor> trainable;             // fp32 masters, group by group, in group order
  std::vector<std::pair<std::string, std::string>> aliases;  // tied entries of `module`: alias -> owner
};

// Names the masters of `ms.unfused_fp32_groups`. FP16_UnfusedOptimizer keeps, per param group, the params
// that require grad in group order. Groups made from module.parameters() (DeepSpeed's default, or HF
// Trainer's decay / no-decay filters) list their params in `module` order, which holds them without
// buffers, tied repeats (entries sharing an earlier entry's storage) and frozen params. Frozen params are
// not marked in the file: each group's masters are matched by shape, in order, to the parameters earlier
// groups left, and the match must be the only one possible. Throws FormatError when no order-keeping match
// exists (groups in another order) and UnsupportedError when several do (a frozen param beside a trainable
// one of the same shape), naming the file.
ModelStateMasters name_unfused_masters(const ModelStates& ms);
// The same for `groups` (indices into ms.unfused_fp32_groups) only, matched in that order.
ModelStateMasters name_unfused_masters(const ModelStates& ms, const std::vector<size_t>& groups);

// Slices the masters of `ms.fused_fp32_groups_flat`. FP16_Optimizer (fused) flattens each group's params
// that require grad, in group order, into one 16-bit buffer and makes the params views into it; its fp32
// master is that buffer cast. So `module`'s trainable entries are views into one storage per group, of the
// group's size, that they tile; each one's offset there is its offset in the master. Throws FormatError
// when no storage fits a group and UnsupportedError when several do, naming the file.
ModelStateMasters slice_fused_masters(const ModelStates& ms);

}  // namespace ckptfs::deepspeed
