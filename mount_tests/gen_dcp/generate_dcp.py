#!/usr/bin/python3
"""Writes real PyTorch Distributed Checkpoints (torch.distributed.checkpoint, torch >= 2.6, gloo on CPU)
plus what PyTorch's own converter makes of them.  Runs INSIDE the Debian 13 chroot (python3-torch 2.6);
on the host use run_generator.py, which copies this folder into the chroot and runs it there.

    python3 generate_dcp.py OUT_DIR [--only NAME ...] [--list] [--force]

Per case OUT_DIR/<case>/:
  checkpoint/   exactly what the training stack leaves (see dcp_cases.py for the layout of each case)
  expected/     computed by PyTorch, never by ckptfs:
                full_state.pt (or full_state/<dcp dir>.pt): format_utils.dcp_to_torch_save's output;
                model.pt, fp32.pt: plain dicts name -> contiguous tensor, by the rule of
                docs/formats/dcp.md (the 'model' subtree, else every tensor outside the training-state
                top-level keys; fp32.pt upcasts float16/bfloat16 exactly), in .metadata order.
                Step-dir layouts: expected/<tag>/...
  case.json     layout, tags, latest, per tag the views -> expected files, model names, side files,
                and facts about the .metadata written (pickle protocol, GLOBALs, chunks, files).
Cases are written to OUT_DIR/.tmp-<case>-<pid> and renamed into place; a case whose case.json carries
the current GEN_VERSION is skipped.

Ranks are separate processes (`generate_dcp.py --worker RANK WS PORT ROOT CASE...`) joined with
init_process_group("gloo", tcp://127.0.0.1:PORT) -- no torch.multiprocessing, no /dev/shm, no /proc
needed, so it runs in a bare chroot.  Training is real torch.optim.AdamW steps on the sharded
parameters (DTensor / FSDP2 fully_shard) with seeded synthetic gradients: FSDP2's forward needs
accelerator streams, which torch 2.6 lacks on CPU.
"""
import argparse
import copy
import dataclasses
import datetime
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))  # in the tree; in the chroot, case_cache.py and llama_layout.py are copied beside this
from case_cache import case_is_current, install_case  # noqa: E402
from llama_layout import llama_tensors  # noqa: E402
from dcp_cases import BAD_GOOD, BAD_VARIANTS, CASES, GEN_VERSION  # noqa: E402

WORKER_TIMEOUT = 300
# top-level keys that are training state, not the model (docs/formats/dcp.md)
TRAINING_STATE_KEYS = {"optimizer", "optim", "optimizer_state", "lr_scheduler", "scheduler", "train_state",
                       "dataloader", "rng", "rng_state", "extra_state"}


def natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# ====================================================================================================
# worker side: one process per rank

def _torch():
    import torch
    import torch.nn as nn
    return torch, nn


def make_module(entries):
    """nn.Module tree from [(fqn, tensor, kind)], kind 'param' / 'buffer' / 'buffer_np' (non-persistent),
    registered in list order (so state_dict order is the tree's order)."""
    torch, nn = _torch()
    root = nn.Module()
    for fqn, t, kind in entries:
        *path, leaf = fqn.split(".")
        mod = root
        for p in path:
            if p not in mod._modules:
                mod.add_module(p, nn.Module())
            mod = mod._modules[p]
        if kind == "param":
            mod.register_parameter(leaf, nn.Parameter(t))
        else:
            mod.register_buffer(leaf, t, persistent=(kind == "buffer"))
    return root


def rand(*shape, dtype=None, scale=0.2):
    torch, _ = _torch()
    t = torch.randn(*shape) * scale
    return t.to(dtype) if dtype is not None else t


def mlp_entries(dtype, extra=()):
    """Linear(37,53), Linear(53,101), Linear(101,5) weights/biases in `dtype`, then `extra`, then stats
    buffers: fp32 `running`, int64 `steps` (a value > 2**40), bool `mask` and a non-persistent one."""
    torch, _ = _torch()
    E = []
    for name, (o, i) in (("fc1", (53, 37)), ("fc2", (101, 53)), ("head", (5, 101))):
        E.append((f"{name}.weight", rand(o, i, dtype=dtype), "param"))
        E.append((f"{name}.bias", rand(o, dtype=dtype), "param"))
    E.extend(extra)
    E.append(("stats.running", torch.randn(11), "buffer"))
    E.append(("stats.steps", torch.tensor([3, 2 ** 40 + 1, -7], dtype=torch.int64), "buffer"))
    E.append(("stats.mask", torch.tensor([True, False, True, True]), "buffer"))
    E.append(("stats.scratch", torch.zeros(3), "buffer_np"))
    return E


def llama_entries(names, dim=36, kv=18, ffn=53, vocab=101, layers=2, dtype=None):
    """A tiny Llama in torchtitan's ('tt') or Hugging Face's ('hf') parameter names."""
    torch, _ = _torch()
    E = [(name, (1 + rand(*shape)).to(dtype or torch.float32) if role == "norm" else rand(*shape, dtype=dtype), "param")
         for name, shape, role, _ in llama_tensors(names, dim, kv, ffn, vocab, layers)]
    if names == "tt":
        E.append(("freqs_cis", torch.randn(7, 9), "buffer_np"))  # torchtitan: persistent=False
    return E


class Ctx:
    def __init__(self, rank, ws):
        self.rank, self.ws = rank, ws

    def mesh(self, shape, names=None):
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh("cpu", shape, mesh_dim_names=names)


def distribute(model, mesh, plan, column_major=()):
    """Replaces each parameter named in `plan` (fqn -> placements) by an nn.Parameter holding a DTensor;
    fqns in `column_major` get local shards stored column-major (strides (1, rows))."""
    _, nn = _torch()
    from torch.distributed.tensor import DTensor, distribute_tensor
    for fqn, placements in plan.items():
        mod_name, _, leaf = fqn.rpartition(".")
        mod = model.get_submodule(mod_name)
        full = getattr(mod, leaf).detach()
        d = distribute_tensor(full, mesh, placements)
        if fqn in column_major:
            local = d.to_local().t().contiguous().t()
            d = DTensor.from_local(local, mesh, placements, run_check=False, shape=d.shape, stride=d.stride())
        mod.register_parameter(leaf, nn.Parameter(d))


def train(model, opt, steps, seed, sched=None):
    """`steps` real optimizer steps with seeded gradients, identical on every rank, laid out like each
    parameter (same placements for DTensors)."""
    torch, _ = _torch()
    from torch.distributed.tensor import DTensor, distribute_tensor
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in model.parameters():
            full = (torch.randn(tuple(p.shape), generator=g) * 0.1).to(p.dtype)
            p.grad = distribute_tensor(full, p.device_mesh, p.placements) if isinstance(p, DTensor) else full
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()


def adamw(model):
    torch, _ = _torch()
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=False)


def fsdp2(model, mesh, units):
    from torch.distributed._composable.fsdp import fully_shard
    for u in units:
        fully_shard(model.get_submodule(u), mesh=mesh)
    fully_shard(model, mesh=mesh)


def shard0_mlp(ctx, dtype):
    """The MLP of mlp_entries(dtype), every parameter a DTensor [Shard(0)] on a 1-D mesh of 2."""
    from torch.distributed.tensor import Shard
    mesh = ctx.mesh((2,))
    m = make_module(mlp_entries(dtype))
    distribute(m, mesh, {n: [Shard(0)] for n, _ in m.named_parameters()})
    return m


def dtensor_mlp_case(ctx, dtype, seed):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    m = shard0_mlp(ctx, dtype)
    opt = adamw(m)
    train(m, opt, 2, seed)
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id="checkpoint")
    return {"description": f"MLP 37-53-101-5 ({dtype}) + fp32/int64/bool buffers; every parameter a DTensor "
                           "[Shard(0)] on a 1-D mesh of 2 (distribute_tensor); AdamW(foreach=False) 2 steps; "
                           "dcp.save({'model', 'optim'} from get_state_dict)"}


def case_dtensor_shard0_fp32_ws2(ctx):
    torch, _ = _torch()
    return dtensor_mlp_case(ctx, torch.float32, 11)


def case_dtensor_shard0_bf16_ws2(ctx):
    torch, _ = _torch()
    return dtensor_mlp_case(ctx, torch.bfloat16, 12)


def case_dtensor_shard1_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import Replicate, Shard
    mesh = ctx.mesh((2,))
    extra = [("extra.row", rand(1, 8), "param"),  # Shard(0) of one row over 2 ranks: rank 1's chunk is empty
             ("extra.kernel", rand(4, 6, 5), "param")]  # 3-D, Shard(2): 5 -> 3 + 2
    m = make_module(mlp_entries(torch.float32, extra))
    plan = {}
    for n, p in m.named_parameters():
        plan[n] = [Shard(1)] if p.dim() == 2 else [Replicate()]
    plan["extra.row"] = [Shard(0)]
    plan["extra.kernel"] = [Shard(2)]
    distribute(m, mesh, plan, column_major={"fc2.weight"})
    opt = adamw(m)
    train(m, opt, 2, 13)
    msd, osd = get_state_dict(m, opt)
    local = {n: list(p.to_local().stride()) for n, p in m.named_parameters()}
    dcp.save({"model": msd, "optim": osd}, checkpoint_id="checkpoint")
    return {"description": "MLP 37-53-101-5 fp32: 2-D weights [Shard(1)] (37 -> 19+18, 53 -> 27+26, 101 -> 51+50), "
                           "fc2.weight's local shards column-major (DTensor.from_local), biases [Replicate()], "
                           "extra.row [1,8] [Shard(0)] (rank 1 holds an empty chunk), extra.kernel [4,6,5] "
                           "[Shard(2)]; AdamW 2 steps; {'model', 'optim'} from get_state_dict",
            "local_strides_rank%d" % ctx.rank: local}


def case_mesh2d_ws4(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import Replicate, Shard
    mesh = ctx.mesh((2, 2), ("dp", "tp"))
    m = make_module(mlp_entries(torch.float32, [("extra.kernel", rand(4, 6, 5), "param")]))
    plan = {"fc1.weight": [Shard(0), Shard(1)], "fc1.bias": [Shard(0), Replicate()],
            "fc2.weight": [Shard(1), Shard(0)], "fc2.bias": [Replicate(), Shard(0)],
            "head.weight": [Shard(0), Shard(0)], "head.bias": [Replicate(), Replicate()],
            "extra.kernel": [Shard(2), Shard(1)]}
    distribute(m, mesh, plan)
    opt = adamw(m)
    train(m, opt, 2, 14)
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id="checkpoint")
    return {"description": "MLP 37-53-101-5 fp32 + extra.kernel [4,6,5] on a 2x2 mesh ('dp','tp'): "
                           + ", ".join(f"{k} {[str(p) for p in v]}" for k, v in plan.items())
                           + "; AdamW 2 steps; {'model', 'optim'} from get_state_dict; 4 ranks"}


def case_fsdp2_bf16_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    bf = torch.bfloat16
    E = [("tok.weight", rand(101, 36, dtype=bf), "param")]
    for b in range(2):
        p = f"blocks.{b}."
        E += [(p + "attn.qkv.weight", rand(108, 36, dtype=bf), "param"),
              (p + "attn.proj.weight", rand(36, 36, dtype=bf), "param"),
              (p + "attn.proj.bias", rand(36, dtype=bf), "param"),
              (p + "ln.weight", (1 + rand(36)).to(bf), "param"), (p + "ln.bias", rand(36, dtype=bf), "param"),
              (p + "mlp.up.weight", rand(53, 36, dtype=bf), "param"),
              (p + "mlp.down.weight", rand(36, 53, dtype=bf), "param")]
    E += [("ln_f.weight", (1 + rand(36)).to(bf), "param"), ("lm_head.weight", rand(101, 36, dtype=bf), "param"),
          ("pos_scale", torch.randn(7), "buffer"), ("seen_tokens", torch.tensor([123456789012], dtype=torch.int64), "buffer")]
    m = make_module(E)
    mesh = ctx.mesh((2,))
    fsdp2(m, mesh, ["blocks.0", "blocks.1"])
    opt = adamw(m)
    train(m, opt, 2, 15)
    p = m.get_submodule("tok").weight
    info = {"local_rank%d" % ctx.rank: {"tok.weight": [list(p.to_local().shape),
                                                       p.to_local().untyped_storage().nbytes()]}}
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id="checkpoint")
    info["description"] = ("tiny transformer, bf16 parameters, real FSDP2 fully_shard per block + root on a mesh of 2 "
                           "(DTensor Shard(0), padded local shards: 101 rows -> 51 + 50), fp32 and int64 buffers; "
                           "AdamW 2 steps (bf16 moments); {'model', 'optim'} from get_state_dict")
    return info


def case_torchtitan_like_ws2(ctx):
    """torchtitan's CheckpointManager: dcp.save(states) with the model flattened into the top level
    (_flattened_model_states_sd), 'optimizer' flattened (flatten_optimizer_state_dict=True), 'lr_scheduler',
    'dataloader' (per-rank keys), 'train_state' (int32 step tensor, BytesIO leaves); the last step saved
    model-only in an export dtype (last_save_model_only, export_dtype bfloat16)."""
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    m = make_module(llama_entries("tt"))
    mesh = ctx.mesh((2,))
    fsdp2(m, mesh, ["layers.0", "layers.1"])
    opt = adamw(m)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    losses = [3.5, 3.1, 2.8, 2.6]
    for step, nsteps in ((10, 2), (20, 2)):
        train(m, opt, nsteps, 16 + step, sched)
        states = dict(get_model_state_dict(m))
        states["optimizer"] = get_optimizer_state_dict(m, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
        states["lr_scheduler"] = sched.state_dict()
        states["dataloader"] = {f"dp_rank_{ctx.rank}": pickle.dumps({"sample_idx": 8 * step + ctx.rank, "epoch": 0}),
                                "world_size": ctx.ws}
        ts = {"step": torch.tensor(step, dtype=torch.int32)}
        for k, v in (("global_avg_losses", losses[: step // 5]), ("global_max_losses", [x + 1 for x in losses[: step // 5]]),
                     ("log_steps", list(range(1, step + 1, 5)))):
            b = io.BytesIO()
            torch.save(v, b)
            ts[k] = b
        states["train_state"] = ts
        dcp.save(states, checkpoint_id=f"checkpoint/step-{step}")
    train(m, opt, 1, 47, sched)
    sd = {k: v.to(torch.bfloat16) for k, v in get_model_state_dict(m).items()}
    dcp.save(sd, checkpoint_id="checkpoint/step-30")
    return {"description": "torchtitan-like dump folder: checkpoint/step-10, step-20 (model at the top level with "
                           "torchtitan names, optimizer.state.<fqn>.*, optimizer.param_groups.<fqn>.*, lr_scheduler.*, "
                           "dataloader.dp_rank_<r> (per-rank keys) + world_size, train_state.step int32 0-dim, BytesIO "
                           "leaves) and step-30 (last_save_model_only: the flat model state dict cast to bfloat16); "
                           "FSDP2 fully_shard per layer + root, fp32 params, AdamW + LambdaLR"}


def case_hf_trainer_like_ws2(ctx):
    """HF Trainer + accelerate with FSDP (SHARDED_STATE_DICT): output_dir/checkpoint-<step>/ holding
    pytorch_model_fsdp_0/ ({'model': sd}), optimizer_0/ ({'optimizer': osd}) and the Trainer's side files."""
    torch, _ = _torch()
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    m = make_module(llama_entries("hf"))
    mesh = ctx.mesh((2,))
    fsdp2(m, mesh, ["model.layers.0", "model.layers.1"])
    opt = adamw(m)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 1000)
    random.seed(7 + ctx.rank)
    for step in (100, 200):
        train(m, opt, 2, 17 + step, sched)
        d = f"checkpoint/checkpoint-{step}"
        dcp.save({"model": get_model_state_dict(m)}, storage_writer=dcp.FileSystemWriter(f"{d}/pytorch_model_fsdp_0"),
                 planner=dcp.DefaultSavePlanner())
        dcp.save({"optimizer": get_optimizer_state_dict(m, opt)},
                 storage_writer=dcp.FileSystemWriter(f"{d}/optimizer_0"), planner=dcp.DefaultSavePlanner())
        torch.save({"python": random.getstate(), "cpu": torch.get_rng_state()}, f"{d}/rng_state_{ctx.rank}.pth")
        if ctx.rank == 0:
            torch.save(sched.state_dict(), f"{d}/scheduler.pt")
            with open(f"{d}/trainer_state.json", "w") as f:
                json.dump({"global_step": step, "epoch": step / 100, "log_history": [{"loss": 2.5, "step": step}],
                           "best_model_checkpoint": None}, f, indent=2)
            with open(f"{d}/config.json", "w") as f:
                json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 36,
                           "intermediate_size": 53, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "vocab_size": 101, "torch_dtype": "float32"}, f, indent=2)
        dist.barrier()
    return {"description": "HF Trainer/accelerate FSDP layout: checkpoint/checkpoint-100, checkpoint-200, each with "
                           "pytorch_model_fsdp_0/ (DCP of {'model': get_model_state_dict}, HF Llama names), optimizer_0/ "
                           "(DCP of {'optimizer': get_optimizer_state_dict}) as accelerate saves them "
                           "(FileSystemWriter + DefaultSavePlanner), trainer_state.json, config.json, scheduler.pt, "
                           "rng_state_<rank>.pth; FSDP2 fully_shard, fp32"}


def nontensor_leaves(rank):
    torch, _ = _torch()
    return {
        "int": 7, "neg": -3, "big": 2 ** 70, "float": 0.1, "negzero": -0.0, "inf": float("inf"),
        "str": "h\u00e9llo \u2713", "bytes": b"\x00\xffabc", "none": None, "true": True, "false": False,
        "list": [1, "a", 2.5, None], "tuple": (1, (2, 3), "x"), "set": {1, 2, 3},
        "nested": {"a": {"b": {"c": 1}}, "d": [{"e": 2}, 3]},
        "empty_dict": {}, "empty_list": [], "intkeys": {0: "zero", 2: "two"},
        "dtype": torch.bfloat16, "size": torch.Size([2, 3]),
        "tensors_in_list": [torch.arange(4), {"t": torch.ones(2, 3, dtype=torch.float16)}],
        "tuple_with_tensor": (torch.arange(3, dtype=torch.int32), "tag"),
        "bytesio": io.BytesIO(b"raw bytes in a BytesIO"),
    }


def case_nontensor_items_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    m = shard0_mlp(ctx, torch.float32)
    state = {"model": get_model_state_dict(m), "extra": nontensor_leaves(ctx.rank),
             "per_rank": {f"rank{ctx.rank}": {"seed": 100 + ctx.rank, "note": f"r{ctx.rank}"}},
             "who": ctx.rank, "epoch": 3}
    dcp.save(state, storage_writer=dcp.FileSystemWriter("checkpoint", thread_count=2))
    return {"description": "MLP [Shard(0)] model plus non-tensor leaves of every kind (int, big int, float, -0.0, inf, "
                           "str, bytes, None, bools, list, tuple, set, nested dicts, a list of dicts, an empty dict "
                           "(vanishes), dict with int keys, torch.dtype, torch.Size, a list holding tensors (descended), "
                           "a tuple holding a tensor (one bytes item), a BytesIO), per-rank keys, a key with different "
                           "values per rank (dedup keeps one); FileSystemWriter(thread_count=2): two files per rank"}


def case_one_file_per_item_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    m = shard0_mlp(ctx, torch.float32)
    opt = adamw(m)
    train(m, opt, 1, 18)
    msd, osd = get_state_dict(m, opt)
    dcp.save({"model": msd, "optim": osd, "note": "one file per item"},
             storage_writer=dcp.FileSystemWriter("checkpoint", single_file_per_rank=False))
    if ctx.rank == 0:
        with open("checkpoint/config.json", "w") as f:
            json.dump({"model": "mlp", "dims": [37, 53, 101, 5]}, f)
    return {"description": "MLP [Shard(0)] + AdamW 1 step, FileSystemWriter(single_file_per_rank=False): one .distcp per "
                           "item; a config.json beside .metadata (a side file)"}


def case_replicated_dedup_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Replicate, distribute_tensor
    mesh = ctx.mesh((2,))
    m = make_module(mlp_entries(torch.float32))  # plain tensors, identical on every rank (DDP-like)
    opt = adamw(m)
    train(m, opt, 2, 19)
    table = distribute_tensor(rand(64, 16), mesh, [Replicate()])
    dcp.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "replicated": {"table": table}},
             checkpoint_id="checkpoint")
    return {"description": "DDP-like: plain tensors identical on both ranks (model.state_dict(), raw "
                           "optimizer.state_dict() keyed by int param ids), a DTensor [Replicate()] table; DCP "
                           "de-duplicates every replicated item to one rank"}


def case_async_save_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    m = make_module(llama_entries("tt", layers=1))
    mesh = ctx.mesh((2,))
    fsdp2(m, mesh, ["layers.0"])
    opt = adamw(m)
    train(m, opt, 2, 20)
    msd, osd = get_state_dict(m, opt)
    fut = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id="checkpoint")
    fut.result()
    return {"description": "dcp.async_save (CPU, gloo) of an FSDP2 one-layer Llama ({'model', 'optim'}), "
                           "future.result() awaited"}


def case_bad_inputs_ws2(ctx):
    torch, _ = _torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    m = shard0_mlp(ctx, torch.float32)
    dcp.save({"model": get_model_state_dict(m), "step": 5}, checkpoint_id=f"checkpoint/{BAD_GOOD}")
    return {"description": "broken variants of one small DCP dir (MLP [Shard(0)] + a bytes item): checkpoint/"
                           f"{BAD_GOOD}/ is intact; checkpoint/<variant>/ edited as dcp_cases.BAD_VARIANTS says"}


BUILDERS = {name: globals()["case_" + name] for name in CASES}


def worker_main(rank, ws, port, root, names, builders=None):
    """One rank: runs builders[name] (default: this file's cases) for each case, with that case's folder as cwd."""
    builders = builders or BUILDERS
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=WORKER_TIMEOUT))
    for i, name in enumerate(names):
        os.chdir(os.path.join(root, name))
        torch.manual_seed(1000 + sum(map(ord, name)))
        t0 = time.time()
        info = builders[name](Ctx(rank, ws)) or {}
        dist.barrier()
        info["save_seconds"] = round(time.time() - t0, 2)
        with open(f".gen_info_rank{rank}.json", "w") as f:
            json.dump(info, f)
        print(f"rank {rank}: {name} saved in {info['save_seconds']} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can keep a finished rank alive


# ====================================================================================================
# coordinator side: spawns the ranks, then computes the expectations with PyTorch's converter

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(names, ws, root, log_dir, script=None):
    """Spawns `script` (default: this file) --worker RANK WS PORT ROOT NAMES... for each rank and waits."""
    script = script or os.path.abspath(__file__)
    port = free_port()
    env = dict(os.environ, USE_LIBUV="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
               OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    procs, logs = [], []
    for r in range(ws):
        log = open(os.path.join(log_dir, f"ws{ws}_rank{r}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, script, "--worker", str(r), str(ws), str(port),
                                       root, *names], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
    deadline = time.time() + WORKER_TIMEOUT
    failed = None
    while any(p.poll() is None for p in procs):
        if time.time() > deadline:
            failed = f"timed out after {WORKER_TIMEOUT}s"
            break
        bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if bad:
            failed = f"rank {bad[0]} exited with {procs[bad[0]].returncode}"
            break
        time.sleep(0.1)
    if failed is None:
        bad = [i for i, p in enumerate(procs) if p.returncode != 0]
        failed = bad and f"rank {bad[0]} exited with {procs[bad[0]].returncode}"
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if failed:
        tails = []
        for r, log in enumerate(logs):
            log.seek(0)
            lines = [l for l in log.read().splitlines() if "UCX" not in l and "cpuinfo" not in l]
            tails.append(f"--- rank {r} ---\n" + "\n".join(lines[-40:]))
        raise RuntimeError(f"DCP save workers for {names} (world size {ws}): {failed}\n" + "\n".join(tails))
    for log in logs:
        log.close()


class _RecordingUnpickler(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f)
        self.globals = []

    def find_class(self, module, name):
        if (module, name) not in self.globals:
            self.globals.append((module, name))
        return super().find_class(module, name)


def load_metadata(dcp_dir):
    """(Metadata, facts about the pickle) -- plain pickle.load, as FileSystemReader does."""
    import pickletools
    path = os.path.join(dcp_dir, ".metadata")
    with open(path, "rb") as f:
        raw = f.read()
    up = _RecordingUnpickler(io.BytesIO(raw))
    md = up.load()
    op, arg, _ = next(pickletools.genops(raw))
    facts = {"pickle_protocol": arg if op.name == "PROTO" else None,
             "globals": [f"{m}.{n}" for m, n in up.globals],
             "metadata_fields": sorted(vars(md)),
             "checkpoint_id_type": type(getattr(getattr(md, "storage_meta", None), "checkpoint_id", None)).__module__ + "." +
             type(getattr(getattr(md, "storage_meta", None), "checkpoint_id", None)).__qualname__,
             "metadata_bytes": len(raw)}
    return md, facts


def describe_dcp(dcp_dir, md, facts):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    n_t = n_b = n_chunks = n_empty = 0
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            n_t += 1
            n_chunks += len(m.chunks)
            n_empty += sum(1 for c in m.chunks if math.prod(c.sizes) == 0 and len(c.sizes))
        else:
            n_b += 1
    files = sorted((f for f in os.listdir(dcp_dir) if f.endswith(".distcp")), key=natural_key)
    used = sorted({i.relative_path for i in md.storage_data.values()}, key=natural_key)
    facts = dict(facts, entries=len(md.state_dict_metadata), tensors=n_t, bytes_items=n_b, chunks=n_chunks,
                 empty_chunks=n_empty, storage_items=len(md.storage_data), distcp_files=files,
                 files_in_storage_data=used)
    return facts


def get_path(root, path):
    cur = root
    for p in path:
        cur = cur[p]
    return cur


def model_tensors(md, full):
    """The model view by the rule of docs/formats/dcp.md, in .metadata order: names and tensors."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    has_model = isinstance(full, dict) and isinstance(full.get("model"), dict)
    out = {}
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            continue
        path = tuple(md.planner_data[fqn]) if md.planner_data else (fqn,)
        if has_model:
            if path[0] != "model":
                continue
            name = ".".join(str(p) for p in path[1:])
        else:
            if path[0] in TRAINING_STATE_KEYS:
                continue
            name = ".".join(str(p) for p in path)
        assert name not in out, f"duplicate model name {name}"
        out[name] = get_path(full, path).detach().contiguous().clone()
    return out


def to_fp32(model):
    import torch
    return {k: (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v.clone()) for k, v in model.items()}


def expect_dcp_dir(dcp_dir, out_pt):
    """dcp_to_torch_save(dcp_dir, out_pt) and the nested state it wrote (loaded back)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    os.makedirs(os.path.dirname(out_pt), exist_ok=True)
    dcp_to_torch_save(dcp_dir, out_pt)
    return torch.load(out_pt, map_location="cpu", weights_only=False)


def side_files(d):
    return sorted((f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)) and f != ".metadata"
                   and not f.endswith(".distcp")), key=natural_key)


def expect_tag(case_dir, tag_rel, exp_rel):
    """Expectations for one tag (a DCP dir or a folder of DCP dirs) into case_dir/exp_rel."""
    import torch
    tag_dir = os.path.join(case_dir, tag_rel)
    exp_dir = os.path.join(case_dir, exp_rel)
    os.makedirs(exp_dir, exist_ok=True)
    info = {"path": tag_rel, "expected": exp_rel, "side_files": side_files(tag_dir), "dcp": {}}
    if os.path.isfile(os.path.join(tag_dir, ".metadata")):
        info["kind"] = "dcp_dir"
        dirs = {".": "full_state.pt"}
        model_dir = "."
    else:
        info["kind"] = "dcp_folder"
        subs = sorted((d for d in os.listdir(tag_dir) if os.path.isfile(os.path.join(tag_dir, d, ".metadata"))),
                      key=natural_key)
        assert subs, f"no DCP dir in {tag_dir}"
        dirs = {d: f"full_state/{d}.pt" for d in subs}
        models = [d for d in subs if d.startswith("pytorch_model") or d.startswith("model")]
        assert len(models) == 1, f"{tag_dir}: model dirs {models}"
        model_dir = models[0]
    info["model_dir"] = model_dir
    info["full_state"] = {}
    for d, view in dirs.items():
        src = os.path.normpath(os.path.join(tag_dir, d))
        full = expect_dcp_dir(src, os.path.join(exp_dir, view))
        md, facts = load_metadata(src)
        info["dcp"][d] = describe_dcp(src, md, facts)
        info["full_state"][view] = os.path.join(exp_rel, view)
        if d == model_dir:
            model = model_tensors(md, full)
            torch.save(model, os.path.join(exp_dir, "model.pt"))
            torch.save(to_fp32(model), os.path.join(exp_dir, "fp32.pt"))
            info["model_names"] = list(model)
            info["model_dtypes"] = sorted({str(v.dtype).replace("torch.", "") for v in model.values()})
            info["top_level_keys"] = list(full) if isinstance(full, dict) else None
    assert info["model_names"], f"{tag_dir}: empty model view"
    return info


# --------------------------------------------------------------------------------------------------
# broken variants (bad_inputs_ws2)

def _fresh_class(module_name, class_name):
    """A new class registered as module_name.class_name, so that pickle writes that GLOBAL."""
    import importlib
    mod = importlib.import_module(module_name)
    cls = type(class_name, (), {"__module__": module_name})
    cls.__qualname__ = class_name
    setattr(mod, class_name, cls)
    return cls


def _impostor(class_name, obj):
    """obj's attributes in an instance of a fresh torch.distributed.checkpoint.metadata.<class_name>."""
    new = _fresh_class("torch.distributed.checkpoint.metadata", class_name)()
    new.__dict__.update(vars(obj))
    return new


def write_bad_variants(ckpt_root):
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
    good = os.path.join(ckpt_root, BAD_GOOD)
    md0, _ = load_metadata(good)
    fqn = "model.fc1.weight"
    tsm0 = md0.state_dict_metadata[fqn]
    assert len(tsm0.chunks) == 2, tsm0

    def key_of(md, chunk):
        return next(k for k in md.storage_data if k.fqn == fqn and k.offset == chunk.offsets)

    done = {}
    for variant in BAD_VARIANTS:
        d = os.path.join(ckpt_root, variant)
        shutil.copytree(good, d)
        md = copy.deepcopy(md0)
        tsm = md.state_dict_metadata[fqn]
        c0, c1 = tsm.chunks
        root_obj = md
        if variant == "item_outside_file":
            k = key_of(md, c1)
            info = md.storage_data[k]
            size = os.path.getsize(os.path.join(d, info.relative_path))
            md.storage_data[k] = dataclasses.replace(info, length=size - info.offset + 4096)
            what = f"{fqn} chunk {list(c1.offsets)}: {info.relative_path} [{info.offset}, +{size - info.offset + 4096}) > {size} bytes"
        elif variant == "overlapping_chunks":
            off = torch.Size([10] + [0] * (len(c0.offsets) - 1))
            tsm.chunks.append(ChunkStorageMetadata(offsets=off, sizes=c0.sizes))
            md.storage_data[MetadataIndex(fqn=fqn, offset=off, index=2)] = md.storage_data[key_of(md, c0)]
            what = f"{fqn}: extra chunk offsets {list(off)} sizes {list(c0.sizes)} (chunk 0's bytes) overlaps chunk 0"
        elif variant == "missing_chunk":
            del md.storage_data[key_of(md, c1)]
            tsm.chunks.pop()
            what = f"{fqn}: chunk {list(c1.offsets)} removed (rows {c1.offsets[0]}.. uncovered)"
        elif variant == "chunk_without_storage":
            del md.storage_data[key_of(md, c1)]
            what = f"{fqn}: chunk {list(c1.offsets)} has no storage_data entry"
        elif variant == "chunk_outside_tensor":
            tsm.size = torch.Size([40] + list(tsm.size[1:]))
            what = f"{fqn}: size {list(tsm.size)} but chunk 1 spans rows {c1.offsets[0]}..{c1.offsets[0] + c1.sizes[0]}"
        elif variant == "dtype_mismatch":
            tsm.properties = dataclasses.replace(tsm.properties, dtype=torch.float64)
            what = f"{fqn}: properties.dtype float64, chunks stored as float32"
        elif variant == "unknown_transform":
            k = key_of(md, c1)
            info = dataclasses.replace(md.storage_data[k])
            info.transform_descriptors = ["stream.lzma9/1"]  # pickled with the instance dict, as torch >= 2.7 does
            md.storage_data[k] = info
            what = f"{fqn} chunk {list(c1.offsets)}: transform_descriptors ['stream.lzma9/1']"
        elif variant == "unknown_entry_class":
            obj = _impostor("QuantizedStorageMetadata", tsm)
            obj.scheme = "int4"
            md.state_dict_metadata[fqn] = obj
            what = f"{fqn}: state_dict_metadata value is a torch.distributed.checkpoint.metadata.QuantizedStorageMetadata"
        elif variant == "unknown_metadata_class":
            root_obj = _impostor("MetadataV9", md)
            what = "the root object is a torch.distributed.checkpoint.metadata.MetadataV9"
        elif variant == "truncated_metadata":
            what = ".metadata cut to half its size"
        else:
            raise AssertionError(variant)
        path = os.path.join(d, ".metadata")
        with open(path, "wb") as f:
            pickle.dump(root_obj, f)
        if variant == "truncated_metadata":
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
        done[variant] = what
    return done


# --------------------------------------------------------------------------------------------------

def finish_case(name, case_dir):
    """Expectations and case.json for a case whose checkpoint/ the ranks have written."""
    import torch
    ws, layout = CASES[name]
    info = {"name": name, "generator_version": GEN_VERSION, "torch_version": torch.__version__,
            "python_version": sys.version.split()[0], "world_size": ws, "layout": layout, "src": "checkpoint"}
    gen = {}
    for r in range(ws):
        p = os.path.join(case_dir, f".gen_info_rank{r}.json")
        with open(p) as f:
            g = json.load(f)
        os.unlink(p)
        for k, v in g.items():
            if k == "save_seconds":
                gen.setdefault("save_seconds", []).append(v)
            else:
                gen.setdefault(k, v)
    info.update(gen)
    ck = os.path.join(case_dir, "checkpoint")
    if layout == "bad":
        info["variants"] = write_bad_variants(ck)
        info["good"] = expect_tag(case_dir, f"checkpoint/{BAD_GOOD}", f"expected/{BAD_GOOD}")
        return info
    if layout == "dcp_dir":
        tags = {"checkpoint": expect_tag(case_dir, "checkpoint", "expected")}
        info["root_side_files"] = []
    else:
        names = sorted((d for d in os.listdir(ck) if os.path.isdir(os.path.join(ck, d))), key=natural_key)
        tags = {t: expect_tag(case_dir, f"checkpoint/{t}", f"expected/{t}") for t in names}
        info["root_side_files"] = side_files(ck)
    info["tags"] = list(tags)
    info["latest"] = max(tags, key=lambda t: int(re.findall(r"\d+", t)[-1]) if re.findall(r"\d+", t) else -1) \
        if layout == "step_dirs" else "checkpoint"
    info["tag_info"] = tags
    return info


def publish_case(case_dir, info, out_dir, name):
    """Writes case.json into the finished case_dir and moves it to out_dir/name (replacing an older one)."""
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump(info, f, indent=1)
    install_case(case_dir, out_dir, name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for n, (ws, layout) in CASES.items():
            print(f"{n}\tws={ws}\t{layout}")
        return 0
    if not args.out_dir:
        ap.error("OUT_DIR is required")
    names = args.only or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; --list shows them")
    os.makedirs(args.out_dir, exist_ok=True)
    todo = [n for n in names
            if args.force or not case_is_current(os.path.join(args.out_dir, n), GEN_VERSION)]
    if not todo:
        print("generate_dcp: every case is current")
        return 0
    t0 = time.time()
    work = os.path.join(args.out_dir, f".tmp-dcp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, ".logs"))
    try:
        for n in todo:
            os.makedirs(os.path.join(work, n))
        by_ws = {}
        for n in todo:
            by_ws.setdefault(CASES[n][0], []).append(n)
        for ws, group in sorted(by_ws.items()):
            t1 = time.time()
            run_workers(group, ws, work, os.path.join(work, ".logs"))
            print(f"generate_dcp: saved {len(group)} case(s) with {ws} ranks in {time.time() - t1:.1f} s", flush=True)
        for n in todo:
            t1 = time.time()
            case_dir = os.path.join(work, n)
            info = finish_case(n, case_dir)
            info["expect_seconds"] = round(time.time() - t1, 2)
            publish_case(case_dir, info, args.out_dir, n)
            print(f"generate_dcp: {n} done", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"generate_dcp: {len(todo)} case(s) in {time.time() - t0:.1f} s")
    return 0


def entry_point(main_fn, builders):
    """A generator script's command line: `--worker RANK WS PORT ROOT NAMES...` runs one rank, else main_fn()."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        r, ws, port, root, *names = sys.argv[2:]
        worker_main(int(r), int(ws), int(port), root, names, builders)
    sys.exit(main_fn())


if __name__ == "__main__":
    entry_point(main, BUILDERS)
