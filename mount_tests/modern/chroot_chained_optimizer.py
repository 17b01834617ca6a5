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
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

src, dst = sys.argv[1], sys.argv[2]
md = dcp.FileSystemReader(src).read_metadata()
state = {}
for k, m in md.state_dict_metadata.items():
    if k.startswith("optimizer."):
        continue
    if isinstance(m, TensorStorageMetadata):
        state[k] = torch.empty(m.size, dtype=m.properties.dtype)
    else:
        state[k] = io.BytesIO()


class RawBytes(dcp.DefaultLoadPlanner):
    """Keeps bytes items as they are (the default planner unpickles them, which needs Megatron's classes)."""
    def load_bytes(self, read_item, value):
        value.seek(0)
        self.original_state_dict[read_item.dest_index.fqn] = io.BytesIO(value.read())


dcp.load(state, storage_reader=dcp.FileSystemReader(src), planner=RawBytes(), no_dist=True)
g = torch.Generator().manual_seed(0)
for i, n in ((0, 5000), (1, 7000)):
    pre = f"chained_{i}.optimizer.distributed.dp_group_idx_0"
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        state[f"{pre}.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.{kind}"] = torch.randn(n, generator=g)
    b = io.BytesIO()
    torch.save([[{("torch.bfloat16", "torch.float32"): [n]}]], b)  # a ShardedObject: torch.save([obj])
    state[f"{pre}.per_bucket_numel_unpadded/shard_0_1"] = b


class RawBytesSave(dcp.DefaultSavePlanner):
    """Writes the kept bytes as they are (the default planner would torch.save the BytesIO object itself)."""
    def transform_object(self, write_item, object):
        return object if isinstance(object, io.BytesIO) else super().transform_object(write_item, object)


os.makedirs(dst, exist_ok=True)
dcp.save(state, storage_writer=dcp.FileSystemWriter(dst), planner=RawBytesSave(), no_dist=True)
shutil.copy(os.path.join(src, "metadata.json"), dst)
print("wrote", len(state), "items")
