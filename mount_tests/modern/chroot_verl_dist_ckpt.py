"""Runs in the sid chroot (torch 2.14): python3 chroot_verl_dist_ckpt.py SRC_ITER_DIR DST_DIST_CKPT.

The dist_ckpt/ verl's Megatron backend writes with checkpoint.save_contents ['model', 'extra'] (no optimizer), from a
real Megatron-Bridge torch_dist iteration dir: every item but the optimizer's, rewritten by torch's own DCP reader and
writer (bytes items byte for byte), plus metadata.json. Both stacks save GPTModel.sharded_state_dict() through
megatron-core's dist_checkpointing, so the model keys are the ones verl writes. The optimizer is left out because the
Bridge run's distributed-optimizer buckets follow its local layer spec's parameter order, which a verl run (always the
TransformerEngine spec, verl/models/mcore/model_initializer.py) never has.
"""
import os
import shutil
import sys

from chroot_dcp_raw import load_raw, save_raw

src, dst = sys.argv[1], sys.argv[2]
state = load_raw(src, keep=lambda key: not key.startswith("optimizer."))
os.makedirs(dst)
save_raw(state, dst)
shutil.copy(os.path.join(src, "metadata.json"), dst)
print("wrote", len(state), "items")
