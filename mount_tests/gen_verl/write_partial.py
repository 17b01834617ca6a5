"""Runs inside the Debian unstable chroot (torch 2.14): writes OUT/global_step_1/actor/ as a one-rank verl
role dir whose model file holds a DTensor with a Partial placement (pending reduction: no merge rule), for
the test that ckptfs refuses it naming the file.

    python3 write_partial.py OUT
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Shard


def main(out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29731", USE_LIBUV="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    state = {"model.norm.weight": DTensor.from_local(torch.ones(4), mesh, [Shard(0)]),
             "lm_head.weight": DTensor.from_local(torch.ones(3, 4), mesh, [Partial()])}
    actor = os.path.join(out, "global_step_1", "actor")
    os.makedirs(actor)
    torch.save(state, os.path.join(actor, "model_world_size_1_rank_0.pt"))
    with open(os.path.join(actor, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": 1}, f, indent=4)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
