"""Writes the torch 2.14 DCP layouts with PyTorch's own torch.distributed.checkpoint, inside the Debian
unstable chroot (python3-torch 2.14, python3-zstandard, safetensors 0.8): 2 ranks spawned with
torch.multiprocessing, gloo on 127.0.0.1 (USE_LIBUV=0), a CPU mesh.

    python3 generate_dcp214.py OUT_DIR [--only NAME ...] [--force]

Cases (dcp_cases.CASES_214):
- safetensors_format_ws2: FileSystemWriter(serialization_format=SAFETENSORS): each __R_0.distcp is the
  rank's bytes items then one safetensors blob of its chunks (.metadata's tensor offsets all point at it);
- dtypes_zstd_nocoll_ws2: every float8 kind (all 256 patterns, sharded), 0-dim and empty float8,
  uint16/32/64, float64/16, bfloat16, saved through the ZStandard extension with use_collectives=False
  (zstd frames and one __R.metadata per rank).
Expected result, independent of DCP's reader and of ckptfs: the state the ranks saved, each DTensor
replaced by the full tensor its shards were cut from, torch.save'd on rank 0 as expected.pt (the nested state full_state.pt must equal; its "model"
dict is the model view, and the clients derive fp32/ with torch's own `.float()`).
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))  # in the tree; in the chroot, case_cache.py is copied beside this
from case_cache import cases_to_generate, install_case  # noqa: E402
from dcp_cases import CASES_214, GEN_VERSION_214  # noqa: E402
from generate_dcp import free_port  # noqa: E402

FLOAT8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]


FULL = {}  # id(DTensor) -> the full tensor it was cut from


def expected_state(state):
    """The state as one process holds it: every DTensor replaced by the full tensor it was cut from."""
    import torch
    if isinstance(state, dict):
        return {k: expected_state(v) for k, v in state.items()}
    if id(state) in FULL:
        return FULL[id(state)]
    if isinstance(state, torch.Tensor):
        return state.clone()
    return state


def shard0(t, mesh):
    """A DTensor [Shard(0)] whose rank-local shard is this rank's rows of `t` (the same full tensor on
    every rank): DTensor.from_local, as gloo has no scatter or gather for float8 and uint16-64."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
    local = t.chunk(dist.get_world_size())[dist.get_rank()].contiguous()
    d = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride())
    FULL[id(d)] = t.clone()
    return d


def case_safetensors_format(mesh, path):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    g = torch.Generator().manual_seed(5)
    state = {
        "model": {
            "embed.weight": shard0(torch.randn(11, 6, generator=g), mesh),
            "layers.0.mlp.weight": shard0(torch.randn(8, 11, generator=g).to(torch.bfloat16), mesh),
            "layers.0.mlp.weight_fp8": shard0(torch.randn(6, 4, generator=g).to(torch.float8_e4m3fn), mesh),
            "layers.0.norm.weight": torch.randn(6, generator=g).to(torch.float16),  # replicated
            "layers.0.counts": torch.arange(5, dtype=torch.int64),
            "layers.0.ids": torch.tensor([1, 40000, 65535], dtype=torch.int64).to(torch.uint16),
        },
        "extra": {"step": 7, "lr": 0.01, "note": "safetensors serialization"},
    }
    writer = dcp.FileSystemWriter(path, serialization_format=SerializationFormat.SAFETENSORS)
    dcp.save(state, storage_writer=writer)
    return state, {"trixie_clients": True}


def case_dtypes_zstd_nocoll(mesh, path):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard
    g = torch.Generator().manual_seed(9)
    patterns = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    model = {f"all_{k}": shard0(patterns.view(getattr(torch, k)), mesh) for k in FLOAT8}
    model.update({
        "scalar_e4m3fn": torch.tensor(1.5).to(torch.float8_e4m3fn),
        "empty_e5m2": torch.empty(0, 4).to(torch.float8_e5m2),
        "u16": shard0(torch.randint(0, 2**16, (6, 3), generator=g, dtype=torch.int64).to(torch.uint16), mesh),
        "u32": torch.randint(0, 2**31, (5,), generator=g, dtype=torch.int64).to(torch.uint32),
        "u64": torch.tensor([0, 1, 2**40, 2**62], dtype=torch.int64).to(torch.uint64),
        "f64": shard0(torch.randn(4, 3, generator=g, dtype=torch.float64), mesh),
        "f16": torch.randn(7, generator=g).to(torch.float16),
        "bf16": shard0(torch.randn(4, 5, generator=g).to(torch.bfloat16), mesh),
    })
    state = {"model": model, "extra": {"epoch": 2}}
    writer = dcp.FileSystemWriter(path, _extensions=[ZStandard()])
    dcp.save(state, storage_writer=writer, use_collectives=False)
    # safetensors 0.4.5 (torch 2.6's chroot) has no names for the fnuz kinds in model.safetensors
    return state, {"trixie_clients": False}


BUILDERS = {"safetensors_format_ws2": case_safetensors_format, "dtypes_zstd_nocoll_ws2": case_dtypes_zstd_nocoll}


def worker(rank, ws, port, root, names):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,))
    for name in names:
        case_dir = os.path.join(root, name)
        os.chdir(case_dir)
        state, info = BUILDERS[name](mesh, "checkpoint")
        full = expected_state(state)
        if rank == 0:
            torch.save(full, "expected.pt")
            info.update(case=name, generator="generate_dcp214.py", generator_version=GEN_VERSION_214,
                        torch_version=torch.__version__, world_size=ws, src="checkpoint", expected="expected.pt")
            with open(".info.json", "w") as f:
                json.dump(info, f, indent=1)
        dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    out_dir, names = cases_to_generate(__doc__, CASES_214, GEN_VERSION_214, argv)
    if not names:
        return 0
    import torch.multiprocessing as mp
    work = os.path.join(out_dir, f".tmp-dcp214-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    for n in names:
        os.makedirs(os.path.join(work, n))
    try:
        mp.spawn(worker, args=(2, free_port(), os.path.abspath(work), names), nprocs=2, join=True)
        for n in names:
            src = os.path.join(work, n)
            os.rename(os.path.join(src, ".info.json"), os.path.join(src, "case.json"))
            install_case(src, out_dir, n)
            print(f"generate_dcp214: {n} done", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
