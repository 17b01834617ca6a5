"""Runs in the sid chroot (torch 2.14): python3 chroot_chained_optimizer.py SRC_ITER_DIR DST_ITER_DIR.

Rewrites a Megatron torch_dist iteration dir with torch's own DCP reader and writer, keeping every model and run
state item byte for byte and replacing the optimizer state with what a MoE model's distributed optimizer saves in
the dp_reshardable format: megatron-core's ChainedOptimizer (dense and expert DistributedOptimizers) prefixes each
sub-optimizer's keys with chained_0. / chained_1. (megatron/core/optimizer/optimizer.py,
ChainedOptimizer.sharded_state_dict: always for non fully-reshardable distributed optimizer formats), so the
bucket tensors are chained_{i}.optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(...).bucket_idx_0.{param,
exp_avg,exp_avg_sq} with a per_bucket_numel_unpadded ShardedObject beside them.  The bucket contents are random:
only their keys matter (issue 32: they were served in model.safetensors as weights).
"""
import io
import os
import shutil
import sys
import torch

from chroot_dcp_raw import load_raw, save_raw

src, dst = sys.argv[1], sys.argv[2]
state = load_raw(src, keep=lambda k: not k.startswith("optimizer."))
g = torch.Generator().manual_seed(0)
for i, n in ((0, 5000), (1, 7000)):
    pre = f"chained_{i}.optimizer.distributed.dp_group_idx_0"
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        state[f"{pre}.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.{kind}"] = torch.randn(n, generator=g)
    b = io.BytesIO()
    torch.save([[{("torch.bfloat16", "torch.float32"): [n]}]], b)  # a ShardedObject: torch.save([obj])
    state[f"{pre}.per_bucket_numel_unpadded/shard_0_1"] = b


os.makedirs(dst, exist_ok=True)
save_raw(state, dst)
shutil.copy(os.path.join(src, "metadata.json"), dst)
print("wrote", len(state), "items")
