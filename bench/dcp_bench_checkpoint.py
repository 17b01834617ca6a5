"""The chroot side of bench/dcp_bench.sh: runs with torch 2.x (the Debian 13 chroot of
mount_tests/modern/setup_chroot.sh), never on the host.

  python3 dcp_bench_checkpoint.py generate DIR      save the benchmark DCP checkpoint into DIR (4 ranks, gloo
                                                   on CPU, DTensors on CPU device meshes); written to DIR.tmp
                                                   and renamed, then DIR.complete holds SPEC_VERSION
  python3 dcp_bench_checkpoint.py convert DIR OUT   dcp_to_torch_save(DIR, OUT); prints one JSON line:
                                                   torch import seconds, conversion seconds, peak RSS (KiB)
  python3 dcp_bench_checkpoint.py check REF MNT     REF (dcp_to_torch_save's output) against MNT/full_state.pt
                                                   and MNT/model.safetensors (a ckptfs mount): same nesting,
                                                   non-tensor values, dtypes, shapes and tensor values; prints
                                                   one summary line, exits 1 on the first difference

The checkpoint (2 GiB of tensor data, 4 .distcp files of ~512 MiB):
  model      fp32 8192x8192 Shard(0) 1-D mesh of 4; fp32 8192x8192 Shard(1) 1-D; fp32 8192x8192
             (Shard(0), Shard(1)) on a 2x2 mesh; bf16 8192x8192 Shard(1) 1-D; bf16 8192x8192 2-D; fp32
             [8195] Shard(0) uneven (2049, 2049, 2049, 2048); fp32 [8192] replicated (saved once)
  optimizer  AdamW-like state of the two bf16 parameters: exp_avg, exp_avg_sq in fp32 with the parameter's
             placements (4 x 256 MiB), a 0-d step tensor each, param_groups (bytes items)
  step       an int (a bytes item)
Every rank builds only its own local shards (seeded randn) and wraps them with DTensor.from_local: no rank
holds a full tensor.
"""

import json
import math
import os
import resource
import sys
import time

SPEC_VERSION = "dcp-bench-1"  # bump when the checkpoint below changes: bench/dcp_bench.sh regenerates
WORLD = 4
N = int(os.environ.get("DCP_BENCH_N", "8192"))  # smaller only to try the script out

# name -> (dtype name, global shape, mesh ("1d" | "2d"), placements)
MODEL = {
    "embed.weight": ("float32", (N, N), "1d", ("S0",)),
    "layers.0.mlp.up.weight": ("float32", (N, N), "1d", ("S1",)),
    "layers.0.mlp.down.weight": ("float32", (N, N), "2d", ("S0", "S1")),
    "layers.1.attn.qkv.weight": ("bfloat16", (N, N), "1d", ("S1",)),
    "layers.1.mlp.up.weight": ("bfloat16", (N, N), "2d", ("S0", "S1")),
    "lm_head.bias": ("float32", (N + 3,), "1d", ("S0",)),
    "norm.weight": ("float32", (N,), "1d", ("R",)),
}
OPTIMIZED = ["layers.1.attn.qkv.weight", "layers.1.mlp.up.weight"]


def _generate_rank(rank, directory):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    meshes = {"1d": init_device_mesh("cpu", (WORLD,)), "2d": init_device_mesh("cpu", (2, 2))}
    kinds = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}

    def local_box(shape, mesh_name, placements):
        """(offsets, sizes) of this rank's chunk, torch.chunk rule (ceil-sized, last ones short)."""
        mesh = meshes[mesh_name]
        coords = mesh.get_coordinate()
        offsets, sizes = [0] * len(shape), list(shape)
        for mesh_dim, p in enumerate(placements):
            if p == "R":
                continue
            dim = int(p[1])
            n, parts, at = sizes[dim], mesh.size(mesh_dim), coords[mesh_dim]
            step = -(-n // parts)
            begin, end = min(at * step, n), min((at + 1) * step, n)
            offsets[dim] += begin
            sizes[dim] = end - begin
        return offsets, sizes

    def dtensor(seed, dtype, shape, mesh_name, placements):
        _, sizes = local_box(shape, mesh_name, placements)
        # a replicated tensor holds the same values on every rank
        g = torch.Generator().manual_seed(seed if placements == ("R",) else seed * 1000 + rank)
        local = torch.randn(sizes, generator=g, dtype=torch.float32).to(getattr(torch, dtype))
        shape = torch.Size(shape)
        stride = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))  # contiguous
        return DTensor.from_local(local, meshes[mesh_name], [kinds[p] for p in placements], run_check=False,
                                  shape=shape, stride=stride)

    model, optim_state = {}, {}
    for i, (name, (dtype, shape, mesh_name, placements)) in enumerate(MODEL.items()):
        model[name] = dtensor(i, dtype, shape, mesh_name, placements)
    for j, name in enumerate(OPTIMIZED):
        _, shape, mesh_name, placements = MODEL[name]
        optim_state[name] = {
            "step": torch.tensor(1000.0),
            "exp_avg": dtensor(100 + 2 * j, "float32", shape, mesh_name, placements),
            "exp_avg_sq": dtensor(101 + 2 * j, "float32", shape, mesh_name, placements).abs(),
        }
    state = {
        "model": model,
        "optimizer": {
            "state": optim_state,
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
                              "params": list(OPTIMIZED)}],
        },
        "step": 1000,
    }
    dcp.save(state, checkpoint_id=directory)
    dist.barrier()
    dist.destroy_process_group()


def generate(directory):
    import shutil
    import torch.multiprocessing as mp

    tmp = directory + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    stamp = directory + ".complete"
    if os.path.exists(stamp):
        os.remove(stamp)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("DCP_BENCH_PORT", "29517"),
                      USE_LIBUV="0")
    t0 = time.monotonic()
    mp.spawn(_generate_rank, args=(tmp,), nprocs=WORLD, join=True)
    os.rename(tmp, directory)
    with open(stamp, "w") as f:
        f.write(SPEC_VERSION + "\n")
    print(f"generated {directory} in {time.monotonic() - t0:.1f} s")


def convert(directory, out):
    t0 = time.monotonic()
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    t1 = time.monotonic()
    dcp_to_torch_save(directory, out)
    t2 = time.monotonic()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"import_s": round(t1 - t0, 3), "convert_s": round(t2 - t1, 3), "maxrss_kb": rss}))


def check(ref_path, mnt):
    import torch
    from safetensors import safe_open

    ref = torch.load(ref_path, map_location="cpu", mmap=True, weights_only=False)
    got = torch.load(os.path.join(mnt, "full_state.pt"), map_location="cpu", mmap=True, weights_only=False)
    counts = {"tensors": 0, "bytes": 0, "values": 0}

    def same(a, b, path):
        if isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
                raise SystemExit(f"full_state.pt differs at {path}: {type(b).__name__} "
                                 f"{getattr(b, 'dtype', '')} {tuple(getattr(b, 'shape', ()))}, expected "
                                 f"{a.dtype} {tuple(a.shape)}")
            if not torch.equal(a, b):
                raise SystemExit(f"full_state.pt differs at {path}: tensor values")
            counts["tensors"] += 1
            counts["bytes"] += a.numel() * a.element_size()
        elif isinstance(a, dict):
            if not isinstance(b, dict) or list(a) != list(b):
                raise SystemExit(f"full_state.pt differs at {path}: keys {list(b) if isinstance(b, dict) else b!r}")
            for k in a:
                same(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, (list, tuple)):
            if type(a) is not type(b) or len(a) != len(b):
                raise SystemExit(f"full_state.pt differs at {path}: {b!r}")
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]")
        else:
            if type(a) is not type(b) or a != b:
                raise SystemExit(f"full_state.pt differs at {path}: {b!r}, expected {a!r}")
            counts["values"] += 1

    same(ref, got, "state")
    st = 0
    with safe_open(os.path.join(mnt, "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        if sorted(keys) != sorted(ref["model"]):
            raise SystemExit(f"model.safetensors names {sorted(keys)}, expected {sorted(ref['model'])}")
        for k in keys:
            if not torch.equal(f.get_tensor(k), ref["model"][k]):
                raise SystemExit(f"model.safetensors differs at {k}")
            st += 1
    print(f"full_state.pt == dcp_to_torch_save output ({counts['tensors']} tensors, {counts['bytes']} bytes, "
          f"{counts['values']} non-tensor values); model.safetensors == its 'model' ({st} tensors)")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"generate": generate, "convert": convert, "check": check}[cmd](*args)
