#!/usr/bin/python3
"""verl-shaped FSDP checkpoints written by real torch (2.14 in the Debian sid chroot with transformers Llama
models, 2.6 in the Debian 13 chroot: FSDP1 and FSDP2 on a CPU gloo mesh), saved under verl's file names the way verl's
FSDPCheckpointManager.save_checkpoint saves them (docs/formats/verl.md), with independent expectations:

    python3 generate_verl.py OUT_DIR [--only NAME ...] [--force]

Per case (verl_cases.py): OUT_DIR/NAME/checkpoint/ (latest_checkpointed_iteration.txt,
global_step_N/<role>/{model,optim,extra_state}_world_size_W_rank_R.pt, fsdp_config.json, huggingface/) and
OUT_DIR/NAME/expected/global_step_N/<role>/{model,fp32}.pt: every parameter gathered by torch itself
(DTensor.full_tensor), cast to bfloat16 by torch (model.pt: what verl's model_merger writes) and to float32
(fp32.pt: the saved parameters, exactly).
Each rank also checks that its local shards are torch.chunk's pieces of the gathered tensors.  Run by
mount_tests/gen_verl/run_verl_generator.py inside each case's chroot (USE_LIBUV=0, MASTER_ADDR=127.0.0.1).
"""
import contextlib
import json
import os
import random
import shutil
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from case_cache import cases_to_generate  # noqa: E402
from verl_cases import CASES, GEN_VERSION  # noqa: E402

SEED = 1234


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_model(settings):
    """torch 2.6's chroot has no transformers: Llama-style names on a small module (embedding, per layer an
    MLP and a norm, a final norm, the head), and a config.json that says what it is."""
    import torch
    from torch import nn
    h, i, v = settings["hidden"], settings["inter"], settings["vocab"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Module()
            self.mlp.up_proj, self.mlp.down_proj = nn.Linear(h, i, bias=False), nn.Linear(i, h, bias=False)
            self.input_layernorm = nn.Module()
            self.input_layernorm.weight = nn.Parameter(torch.randn(h))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(v, h)
            self.model.layers = nn.ModuleList(Block() for _ in range(settings["layers"]))
            self.model.norm = nn.Module()
            self.model.norm.weight = nn.Parameter(torch.randn(h))
            self.lm_head = nn.Linear(h, v, bias=False)

    torch.manual_seed(SEED)
    config = {"architectures": ["TinyForTest"], "dtype": settings["dtype"], "hidden_size": h, "intermediate_size": i,
              "num_hidden_layers": settings["layers"], "vocab_size": v}
    return Tiny().to(getattr(torch, settings["dtype"])), config, Block


def save_config(config, path):
    if isinstance(config, dict):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    else:
        config.save_pretrained(path)


def make_model(settings, role):
    """(model, config, the decoder-layer class FSDP wraps)"""
    if settings.get("chroot") == "trixie":
        return plain_model(settings)
    import torch
    import transformers as tf
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    config = tf.LlamaConfig(vocab_size=settings["vocab"], hidden_size=settings["hidden"],
                            intermediate_size=settings["inter"], num_hidden_layers=settings["layers"],
                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3)
    torch.manual_seed(SEED + (role == "critic"))  # the same weights on every rank
    if role == "critic":  # verl's critic: AutoModelForTokenClassification, one label
        config.num_labels = 1
        model = tf.LlamaForTokenClassification(config)
    else:
        model = tf.LlamaForCausalLM(config)
    if settings["tiny"]:
        model.model.register_parameter("tiny", torch.nn.Parameter(torch.randn(settings["tiny"])))
    # what from_pretrained(torch_dtype=...) leaves in the config verl saves
    config.architectures = [type(model).__name__]
    config.dtype = getattr(torch, settings["dtype"])
    return model.to(config.dtype), config, LlamaDecoderLayer


def wrap(model, layer_class, settings, mesh):
    """FSDP1 with device_mesh (verl's FSDP path) or FSDP2 fully_shard with verl's shard placement fn."""
    import torch
    if settings["fsdp"] == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        return FSDP(model, device_mesh=mesh, auto_wrap_policy=ModuleWrapPolicy({layer_class}),
                    sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                    device_id=torch.device("cpu"))
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    fsdp_size = mesh["fsdp"].size() if mesh.ndim == 2 else mesh.size()

    def placement(param):  # verl get_shard_placement_fn: the first dim the fsdp size divides
        for i, n in enumerate(param.shape):
            if n % fsdp_size == 0:
                return Shard(i)
        return Shard(0)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, shard_placement_fn=placement)
    return model


def state_ctx(model, settings):
    if settings["fsdp"] == 2:
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig
    return FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=False),
                                ShardedOptimStateDictConfig(offload_to_cpu=False))


def check_local_shards(state, full, mesh_shape, coordinate):
    """Each DTensor's local tensor is torch.chunk's piece of the gathered tensor at this rank's coordinate."""
    import torch
    from torch.distributed.tensor import DTensor
    for k, v in state.items():
        assert isinstance(v, DTensor), f"{k}: {type(v)}"
        piece = full[k]
        for m, p in enumerate(v.placements):
            if p.is_shard():
                chunks = list(torch.chunk(piece, mesh_shape[m], p.dim))
                chunks += [piece.narrow(p.dim, 0, 0)] * (mesh_shape[m] - len(chunks))
                piece = chunks[coordinate[m]]
        assert torch.equal(v._local_tensor, piece), f"{k}: local shard is not torch.chunk's piece"


def worker(rank, name, settings, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    world = settings["world_size"]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    names = ("fsdp",) if len(settings["mesh"]) == 1 else ("ddp", "fsdp")
    mesh = init_device_mesh("cpu", tuple(settings["mesh"]), mesh_dim_names=names)
    coordinate = mesh.get_coordinate()
    info = {}
    for role in settings["roles"]:
        model, config, layer_class = make_model(settings, role)
        model = wrap(model, layer_class, settings, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        done = 0
        for step in settings["steps"]:
            while done < step:  # a training step without collectives: elementwise gradients
                for p in model.parameters():
                    p.grad = p.detach() * 0.5 + 0.01 * (done + 1)
                optimizer.step()
                scheduler.step()
                done += 1
            local = os.path.join(out, "checkpoint", f"global_step_{step}", role)
            os.makedirs(local, exist_ok=True)
            with state_ctx(model, settings):
                state = model.state_dict()
                optim = optimizer.state_dict()
            extra = {"lr_scheduler": scheduler.state_dict(),
                     "rng": {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}}
            for kind, value in (("model", state), ("optim", optim), ("extra_state", extra)):
                torch.save(value, os.path.join(local, f"{kind}_world_size_{world}_rank_{rank}.pt"))
            # gathered by torch (collective); in float32, as gloo gathers no bfloat16 (exact both ways)
            full = {k: v.float().full_tensor().to(v.dtype) for k, v in state.items()}
            check_local_shards(state, full, settings["mesh"], coordinate)
            if rank == 0:
                with open(os.path.join(local, "fsdp_config.json"), "w") as f:
                    json.dump({"FSDP_version": settings["fsdp"], "world_size": world}, f, indent=4)
                save_config(config, os.path.join(local, "huggingface"))
                exp = os.path.join(out, "expected", f"global_step_{step}", role)
                os.makedirs(exp, exist_ok=True)
                torch.save({k: v.detach().bfloat16() for k, v in full.items()}, os.path.join(exp, "model.pt"))
                torch.save({k: v.detach().float() for k, v in full.items()}, os.path.join(exp, "fp32.pt"))
                info[f"global_step_{step}/{role}"] = {
                    k: {"placements": [str(p) for p in v.placements], "shape": list(v.shape),
                        "local_shape": list(v._local_tensor.shape)} for k, v in state.items()}
            dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "checkpoint", "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(settings["steps"][-1]))
        with open(os.path.join(out, "case.json"), "w") as f:
            json.dump({"generator_version": GEN_VERSION, "name": name, "settings": settings,
                       "torch": torch.__version__, "steps": [f"global_step_{s}" for s in settings["steps"]],
                       "latest": f"global_step_{settings['steps'][-1]}", "mesh_dim_names": list(names),
                       "shards": info}, f, indent=1)
    dist.destroy_process_group()


def main():
    out_dir, names = cases_to_generate(__doc__, CASES, GEN_VERSION)
    import torch.multiprocessing as mp
    for name in names:
        out = os.path.join(out_dir, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        settings = CASES[name]
        mp.start_processes(worker, args=(name, settings, out, free_port()), nprocs=settings["world_size"],
                           start_method="spawn")
        print(f"generate_verl: {name} written", flush=True)


if __name__ == "__main__":
    main()
