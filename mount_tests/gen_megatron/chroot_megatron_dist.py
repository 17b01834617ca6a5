#!/usr/bin/python3
"""Runs INSIDE the Debian 13 chroot (python3-torch 2.6): turns the per-rank plans of megatron_dist.py into
real torch_dist DCP dirs, the way Megatron's dist-checkpointing saves them: one gloo process per rank, each
building ShardedTensors from its local chunks (init_from_local_shards) and the bytes items (io.BytesIO), then
torch.distributed.checkpoint.save with FileSystemWriter (one file per rank, torch.save per item) and
DefaultSavePlanner(flatten_state_dict=False) (so .metadata's planner_data is None, as in Megatron's) whose
transform_object leaves the bytes items' io.BytesIO as they are (Megatron's MCoreSavePlanner).
Afterwards each DCP dir is read back with PyTorch's own loader into JOB/full.pt.

    python3 chroot_megatron_dist.py '[[WORLD, [JOB, ...]], ...]'
    (JOB holds rank<r>.pt; the DCP goes to JOB/dcp/)

Workers are plain subprocesses joined over tcp://127.0.0.1 (no torch.multiprocessing, no /dev/shm).
"""
import datetime
import io
import json
import os
import socket
import subprocess
import sys
import time

TIMEOUT = 300


def planner_class():
    """DefaultSavePlanner that writes a bytes item's io.BytesIO as it is, as Megatron's MCoreSavePlanner does
    (the default one would torch.save the BytesIO object itself)."""
    import torch.distributed.checkpoint as dcp

    class BytesAsTheyAre(dcp.DefaultSavePlanner):
        def transform_object(self, write_item, object):  # noqa: A002 (PyTorch's parameter name)
            return object
    return BytesAsTheyAre


def worker(rank, world, port, jobs):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    for job in jobs:
        plan = torch.load(os.path.join(job, f"rank{rank}.pt"), weights_only=False)
        state = {}
        for key, shape in plan["keys"]:  # collective: every rank, same order
            shards = [Shard.from_tensor_and_offsets(t, list(off), rank) for off, t in plan["tensors"].get(key, [])]
            state[key] = init_from_local_shards(shards, *shape)
        for key, obj in plan["objects"]:
            # bytes items: Megatron hands DCP an io.BytesIO of torch.save(obj), which is written as it is (a
            # plain object would be traversed first, and its int dict keys turned into strings)
            buf = io.BytesIO()
            torch.save(obj, buf)
            buf.seek(0)
            state[key] = buf
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(job, "dcp"), thread_count=1),
                 planner=planner_class()(flatten_state_dict=False))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can keep a finished rank alive


def read_back(job):
    """JOB/full.pt: {'tensors': {key: global tensor}, 'bytes': {key: raw bytes}, 'chunks': {key: [(offsets,
    sizes, file)]}, 'order': [key in .metadata's order]} as torch.distributed.checkpoint reads the DCP dir."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    reader = dcp.FileSystemReader(os.path.join(job, "dcp"))
    md = reader.read_metadata()
    tensors = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
               for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    _load_state_dict(tensors, storage_reader=reader, planner=dcp.DefaultLoadPlanner(flatten_state_dict=False),
                     no_dist=True)
    raw, chunks = {}, {}
    for idx, info in md.storage_data.items():
        path = os.path.join(job, "dcp", info.relative_path)
        if idx.offset is None:
            with open(path, "rb") as f:
                f.seek(info.offset)
                raw[idx.fqn] = f.read(info.length)
    for k, v in md.state_dict_metadata.items():
        if isinstance(v, TensorStorageMetadata):
            chunks[k] = [(tuple(c.offsets), tuple(c.sizes), md.storage_data[_index(md, k, c.offsets)].relative_path)
                         for c in v.chunks]
    assert md.planner_data is None
    torch.save({"tensors": tensors, "bytes": raw, "chunks": chunks, "order": list(md.state_dict_metadata)},
               os.path.join(job, "full.pt"))


def _index(md, fqn, offsets):
    from torch.distributed.checkpoint.metadata import MetadataIndex
    return MetadataIndex(fqn, offsets)


def run_world(world, jobs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), str(world), str(port),
                               *jobs], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(world)]
    deadline = time.time() + TIMEOUT
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    failed = [r for r, p in enumerate(procs) if p.poll() != 0]
    for p in procs:
        if p.poll() is None:
            p.kill()
    if failed:
        logs = "\n".join(f"--- rank {r} ---\n{procs[r].communicate()[0][-3000:]}" for r in failed)
        raise SystemExit(f"torch_dist writer: world {world}, rank(s) {failed} failed or timed out\n{logs}")


def main(argv):
    if argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), int(argv[3]), argv[4:])
        return 0
    for world, jobs in json.loads(argv[0]):
        t0 = time.time()
        run_world(world, jobs)
        for job in jobs:
            read_back(job)
        print(f"world {world}: {len(jobs)} DCP dir(s) in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
