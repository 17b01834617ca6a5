#!/usr/bin/python3
"""Per-rank FSDP checkpoints written by real torch 2.14 FSDP (gloo on CPU, one process per rank, the real
transformers model classes), with FSDP's own full state dict of the same model at the same step as the golden:

    python3 generate_fsdp_local.py OUT_DIR [--only NAME ...] [--force]

Per case (fsdp_local_cases.py), OUT_DIR/NAME/:
- checkpoint/: what the save wrote (FSDP1 LOCAL_STATE_DICT `torch.save(model.state_dict(), f)` per rank;
  accelerate 1.14's `Accelerator.save_state` files; HF Trainer's checkpoint-N/ dirs; FSDP2 per-rank DTensor
  state dicts), plus config.json (`model.config.save_pretrained`) unless the case has none.
- expected/[checkpoint-N/]full_state_dict.pt and manifest.json: FSDP1 `FULL_STATE_DICT` with
  `FullStateDictConfig(offload_to_cpu=True, rank0_only=True)` (FSDP2: `get_model_state_dict(model,
  StateDictOptions(full_state_dict=True, cpu_offload=True))`) taken right after the save, rank 0; the manifest
  has name, dtype, shape, nbytes and the sha256 of the little-endian bytes of every tensor.
- expected/[checkpoint-N/]flat_params.pt and flat_manifest.json (FSDP1): what a mount without names serves: every
  unit's whole flat parameter under its state-dict key (`model.layers.0._flat_param`), 1-D, of the ShardedTensor's
  global size (FlatParameter._unpadded_unsharded_size: alignment and use_orig_params' world-size padding
  included, the use_orig_params=False shard padding not), plus the plain tensors the rank files hold besides
  (persistent buffers; not use_orig_params' per-rank pieces).  Taken from FSDP itself: every rank's live sharded
  FlatParameter (`handle.flat_param`, the data FSDP computes with) gathered with all_gather_object and
  concatenated in rank order, cut to that size; checked equal to the concatenation of the local shards of the
  ShardedTensors the rank files were written from.
- tampered/rank{R}.pt (first FSDP1 case): the same state dicts with one ShardedTensor's shard metadata moved by
  one element (rank 1's shard offset + 1 in every file), so its shards no longer tile the global size.
- case.json: settings, versions, the save call, every checkpoint file (size, sha256), the live FlatParameter
  layout of every unit (fqns, shapes, numels_with_padding, is_padding_mask, shared params, aligned_numel,
  dtypes, unpadded / padded / sharded numels, every rank's _shard_numel_padded and _shard_param_infos and
  ShardedTensor shard metadata), what every rank file holds, and "reference_selfcheck": the flat parameters cut
  by that layout (each unit's parameters in order, padding skipped, shared parameters repeated under their
  names) equal the golden tensor for tensor, and each use_orig_params piece in rank r's file equals
  `golden[name].flatten()[intra_param_start_idx:intra_param_end_idx + 1]` of rank r's _shard_param_infos.

Run by run_fsdp_local_generator.py inside the Debian unstable chroot (USE_LIBUV=0, OMP_NUM_THREADS=1).  The cases
of one world size run in one spawned group of processes (one import of torch and transformers per rank).
"""
import copy
import functools
import hashlib
import json
import os
import random
import shutil
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from case_cache import cases_to_generate  # noqa: E402
from fsdp_local_cases import CASES, GEN_VERSION, rank_file  # noqa: E402

LR = 5e-3
TAMPERED_CASE = "fsdp1_llama_ws2_fp32_flat"
TAMPERED_UNIT = "model.layers.0._flat_param"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------------
# models

def custom_model(d):
    """An architecture no table knows: embedding, blocks (fc1, fc2, LayerNorm), a 9-element "gate" Linear(2, 3),
    an untied head, a persistent buffer "scale" and a non-persistent "cache"."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(d["hidden"])
            self.fc1 = nn.Linear(d["hidden"], d["inter"])
            self.fc2 = nn.Linear(d["inter"], d["hidden"])

        def forward(self, h):
            return h + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(h))))

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(d["vocab"], d["hidden"])
            self.blocks = nn.ModuleList(Block() for _ in range(d["layers"]))
            self.gate = nn.Linear(2, 3)
            self.head = nn.Linear(d["hidden"], d["vocab"], bias=False)
            self.register_buffer("scale", torch.tensor([0.5, 0.25, 0.125]))
            self.register_buffer("cache", torch.zeros(4), persistent=False)

        def forward(self, ids):
            h = self.embed(ids)
            for b in self.blocks:
                h = b(h)
            h = h + (self.gate(h[..., :2]) * self.scale).sum(-1, keepdim=True)
            return self.head(h)

    return TinyNet(), None, Block


def make_model(d, dtype, seed):
    """(model, config or None, the decoder-layer class), the same weights on every rank."""
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    arch = d["arch"]
    if arch == "custom":
        model, config, layer = custom_model(d)
    elif arch == "gpt2":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block as layer
        config = tf.GPT2Config(vocab_size=d["vocab"], n_embd=d["hidden"], n_layer=d["layers"], n_head=d["heads"],
                               n_inner=d["inter"], n_positions=d["positions"], tie_word_embeddings=True,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
        model = tf.GPT2LMHeadModel(config)
    else:
        common = dict(vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["inter"],
                      num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["kv"],
                      head_dim=d["head_dim"], max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
        if arch == "llama":
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer as layer
            config = tf.LlamaConfig(tie_word_embeddings=False, **common)
            model = tf.LlamaForCausalLM(config)
        else:
            from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer as layer
            config = tf.Qwen2Config(tie_word_embeddings=True, **common)
            model = tf.Qwen2ForCausalLM(config)
    model = model.to(getattr(torch, dtype))
    if config is not None:  # what from_pretrained(dtype=...) leaves in the config a save_pretrained writes
        config.architectures = [type(model).__name__]
        config.dtype = getattr(torch, dtype)
    return model, config, layer


def decoder_layers(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def wrap_fsdp1(model, layer_cls, s):
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP, MixedPrecision
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import (lambda_auto_wrap_policy, size_based_auto_wrap_policy,
                                             transformer_auto_wrap_policy)
    if s["wrap"] == "transformer":
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls})
    elif s["wrap"] == "size":
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=s["min_params"])
    else:  # the custom model's blocks and its 9-element gate
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, layer_cls) or (
            isinstance(m, torch.nn.Linear) and m.in_features == 2))
    mp = MixedPrecision(param_dtype=getattr(torch, s["mp"])) if s["mp"] else None
    kw = {}
    if s["kind"] in ("accelerate", "trainer"):  # accelerate 1.14's FSDP1 prepare_model arguments but
        # sync_module_states (FSDP refuses it for CPU modules; every rank builds the same weights from the seed)
        kw = dict(limit_all_gathers=True, forward_prefetch=False,
                  backward_prefetch=BackwardPrefetch.BACKWARD_PRE)
    return FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy[s["strategy"]],
                mixed_precision=mp, use_orig_params=s["orig"], device_id=torch.device("cpu"), **kw)


def wrap_fsdp2(model, ws):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (ws,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model, optimizer, scheduler, steps, dims, seed, rank, losses):
    """`steps` real optimizer steps on random tokens (different on every rank)."""
    import torch
    vocab = dims["vocab"]
    for _ in range(steps):
        g = torch.Generator().manual_seed(seed * 1000 + rank * 100 + len(losses))
        ids = torch.randint(3, vocab, (2, 10), generator=g)
        if dims["arch"] != "custom":
            loss = model(input_ids=ids, labels=ids).loss
        else:
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        losses.append(round(loss.item(), 6))


# ----------------------------------------------------------------------------------------------------------------
# golden, manifests, files

def tensor_bytes(t):
    import torch
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_tensors(folder, stem, tensors, source):
    """folder/{stem}.pt (torch.save of a plain dict) and the manifest beside it."""
    import torch
    os.makedirs(folder, exist_ok=True)
    plain = {k: v.detach().clone().contiguous() for k, v in tensors.items()}
    torch.save(plain, os.path.join(folder, stem + ".pt"))
    manifest = {"source": source, "file": stem + ".pt", "count": len(plain), "tensors": [
        {"name": k, "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape),
         "nbytes": v.numel() * v.element_size(), "sha256": hashlib.sha256(tensor_bytes(v)).hexdigest()}
        for k, v in plain.items()]}
    name = "manifest.json" if stem == "full_state_dict" else "flat_manifest.json"
    with open(os.path.join(folder, name), "w") as f:
        json.dump(manifest, f, indent=1)


def file_list(root):
    out = []
    for dp, _, fs in os.walk(root):
        for f in sorted(fs):
            p = os.path.join(dp, f)
            with open(p, "rb") as fh:
                out.append({"path": os.path.relpath(p, root), "size": os.path.getsize(p),
                            "sha256": hashlib.sha256(fh.read()).hexdigest()})
    return sorted(out, key=lambda e: e["path"])


def describe_value(v):
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor
    if isinstance(v, ShardedTensor):
        md = v.metadata()
        return {"type": "ShardedTensor", "global_size": list(md.size), "dtype": str(md.tensor_properties.dtype),
                "shards_metadata": [{"offsets": list(m.shard_offsets), "sizes": list(m.shard_sizes),
                                     "placement": str(m.placement)} for m in md.shards_metadata],
                "local_shards": [{"offsets": list(s.metadata.shard_offsets), "numel": s.tensor.numel()}
                                 for s in v.local_shards()]}
    if isinstance(v, DTensor):
        return {"type": "DTensor", "placements": [str(p) for p in v.placements], "global": list(v.shape),
                "local": list(v._local_tensor.shape), "dtype": str(v.dtype)}
    if isinstance(v, torch.Tensor):
        return {"type": "Tensor", "shape": list(v.shape), "dtype": str(v.dtype)}
    return {"type": type(v).__name__}


def gather0(obj):
    import torch.distributed as dist
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


# ----------------------------------------------------------------------------------------------------------------
# FSDP1: live layout, the flat reference, the self-check

def units(model):
    """[(state-dict key of the unit's flat parameter, its FSDP module, its handle)] in module order."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import clean_tensor_name
    out = []
    for name, m in model.named_modules():
        if isinstance(m, FSDP) and m._handle is not None:
            prefix = clean_tensor_name(name)
            out.append(((f"{prefix}." if prefix else "") + "_flat_param", m, m._handle))
    return out


def unit_layout(key, handle):
    fp = handle.flat_param
    return {"key": key, "module": key.removesuffix("_flat_param").removesuffix("."),
            "fqns": list(fp._fqns), "shapes": [list(s) for s in fp._shapes],
            "numels_with_padding": list(fp._numels_with_padding), "is_padding_mask": list(fp._is_padding_mask),
            "shared_params": [{"name": (i.module_name + "." if i.module_name else "") + i.param_name,
                               "prim": (i.prim_module_name + "." if i.prim_module_name else "") + i.prim_param_name}
                              for i in fp._shared_param_infos],
            "aligned_numel": handle._aligned_numel, "flat_param_dtype": str(fp.dtype).removeprefix("torch."),
            "fwd_bwd_param_dtype": str(handle._fwd_bwd_param_dtype).removeprefix("torch."),
            "unpadded_unsharded_numel": fp._unpadded_unsharded_size.numel(),
            "padded_unsharded_numel": fp._padded_unsharded_size.numel(),
            "sharded_numel": fp._sharded_size.numel()}


def rank_unit_info(handle, st):
    fp = handle.flat_param
    return {"shard_numel_padded": fp._shard_numel_padded,
            "shard_param_infos": [list(i) for i in fp._shard_param_infos],
            "saved_local_numel": sum(s.tensor.numel() for s in st.local_shards())}


def cut(flat, layout):
    """{full name: tensor} of one unit's flat parameter by the live layout (padding skipped, shared repeated)."""
    prefix = layout["module"] + "." if layout["module"] else ""
    out, off, params = {}, 0, iter(zip(layout["fqns"], layout["shapes"]))
    for n, pad in zip(layout["numels_with_padding"], layout["is_padding_mask"]):
        if not pad:
            fqn, shape = next(params)
            out[prefix + fqn] = flat[off:off + n].view(shape)
        off += n
    assert off == layout["padded_unsharded_numel"] or off == layout["unpadded_unsharded_numel"], (off, layout)
    for sp in layout["shared_params"]:
        out[prefix + sp["name"]] = out[prefix + sp["prim"]]
    return out


def fsdp1_snapshot(model, sd):
    """Collective.  Rank 0 gets {"layout": the live layout of every unit with every rank's shard facts, "flat": each
    unit's whole flat parameter, "pieces" / "plain" / "contents": per rank, its use_orig_params pieces, its other
    plain tensors, what its file holds}; the other ranks None."""
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    us = units(model)
    mine = {"units": {}, "pieces": {}, "plain": {}, "contents": {k: describe_value(v) for k, v in sd.items()}}
    unit_keys = {k for k, _, _ in us}
    for key, _, handle in us:
        st = sd[key]
        assert isinstance(st, ShardedTensor), f"{key}: {type(st)}"
        mine["units"][key] = {"live": handle.flat_param.detach().clone(),
                              "saved": [(list(x.metadata.shard_offsets), x.tensor.detach().clone())
                                        for x in st.local_shards()],
                              "info": rank_unit_info(handle, st), "metadata": describe_value(st)}
    orig_names = {n for key, _, h in us for n in full_names(key, h)}
    for k, v in sd.items():
        if k in unit_keys:
            continue
        (mine["pieces"] if k in orig_names else mine["plain"])[k] = v.detach().clone()
    got = gather0(mine)
    if got is None:
        return None
    layout, flat = [], {}
    for key, _, handle in us:
        lay = unit_layout(key, handle)
        full = torch.cat([g["units"][key]["live"] for g in got])[:lay["unpadded_unsharded_numel"]]
        saved = torch.cat([t for g in got for _, t in g["units"][key]["saved"]])
        offsets = [o[0] for g in got for o, _ in g["units"][key]["saved"]]
        assert torch.equal(saved.view(torch.uint8), full.view(torch.uint8)), f"{key}: saved shards != live"
        sizes = [t.numel() for g in got for _, t in g["units"][key]["saved"]]
        assert offsets == [sum(sizes[:i]) for i in range(len(sizes))], f"{key}: shard offsets {offsets}"
        lay["per_rank"] = [g["units"][key]["info"] for g in got]
        lay["sharded_tensor_metadata_rank0"] = got[0]["units"][key]["metadata"]
        lay["saved_shard_offsets"] = offsets
        layout.append(lay)
        flat[key] = full
    return {"layout": layout, "flat": flat, "pieces": [g["pieces"] for g in got],
            "plain": [g["plain"] for g in got], "contents": [g["contents"] for g in got]}


def full_names(key, handle):
    prefix = key.removesuffix("_flat_param")
    fp = handle.flat_param
    return [prefix + f for f in fp._fqns] + [
        prefix + (i.module_name + "." if i.module_name else "") + i.param_name for i in fp._shared_param_infos]


def selfcheck(snap, golden):
    """The cutting rules checked against the golden (rank 0)."""
    import torch
    problems, cut_all = [], {}
    for lay in snap["layout"]:
        cut_all.update(cut(snap["flat"][lay["key"]], lay))
    plain0 = snap["plain"][0]
    for r, plain in enumerate(snap["plain"]):
        for k, v in plain.items():
            if not torch.equal(v, plain0[k]):
                problems.append(f"plain tensor {k} differs between rank 0 and rank {r}")
    merged = dict(cut_all)
    merged.update(plain0)
    missing = [k for k in golden if k not in merged]
    extra = [k for k in merged if k not in golden]
    if missing or extra:
        problems.append(f"names: missing {missing}, not in the golden {extra}")
    for k, v in golden.items():
        if k in merged and (merged[k].dtype != v.dtype or tuple(merged[k].shape) != tuple(v.shape)
                            or tensor_bytes(merged[k]) != tensor_bytes(v)):
            problems.append(f"{k}: cut {merged[k].dtype} {tuple(merged[k].shape)} != golden")
    npieces = 0
    for r, pieces in enumerate(snap["pieces"]):
        for lay in snap["layout"]:
            prefix = lay["module"] + "." if lay["module"] else ""
            for fqn, info in zip(lay["fqns"], lay["per_rank"][r]["shard_param_infos"]):
                name = prefix + fqn
                if name not in pieces:
                    continue
                in_shard, _, numel, start, end = info
                want = golden[name].reshape(-1)[start:end + 1] if in_shard else golden[name].reshape(-1)[:0]
                npieces += 1
                if pieces[name].dim() != 1 or tensor_bytes(pieces[name]) != tensor_bytes(want):
                    problems.append(f"rank {r} piece {name} != golden[{start}:{end}+1]")
    return {"ok": not problems, "problems": problems, "names_checked": len(golden), "orig_pieces_checked": npieces,
            "plain_tensors_in_rank_files": sorted(plain0)}


def check_features(name, wanted, orig, snap):
    """The padding cases the live FlatParameters show; asserts those `wanted` are there."""
    found = set()
    for lay in snap["layout"]:
        mask = lay["is_padding_mask"]
        if any(mask[:-1]):
            found.add("align_pad")
        if orig and mask and mask[-1]:
            found.add("ws_pad")
        if any(r["shard_numel_padded"] > 0 for r in lay["per_rank"]):
            found.add("tail_pad")
        if any(r["saved_local_numel"] == 0 for r in lay["per_rank"]):
            found.add("empty_rank")
        if orig and any(not i[0] for r in lay["per_rank"] for i in r["shard_param_infos"]):
            found.add("empty_piece")
    missing = [f for f in wanted if f not in found]
    assert not missing, f"{name}: features {missing} not found (found {sorted(found)})"
    return sorted(found)


def tampered_state_dict(model, rank):
    """A LOCAL state dict whose TAMPERED_UNIT ShardedTensor says rank 1's shard starts one element later."""
    sd = fsdp1_local(model)
    st = sd[TAMPERED_UNIT]
    md = copy.deepcopy(st._metadata)
    md.shards_metadata[1].shard_offsets = [md.shards_metadata[1].shard_offsets[0] + 1]
    st._metadata = md
    if rank == 1:
        for x in st._local_shards:
            x.metadata = copy.deepcopy(x.metadata)
            x.metadata.shard_offsets = [x.metadata.shard_offsets[0] + 1]
    return sd


def fsdp1_golden(model):
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        return model.state_dict()


def fsdp1_local(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        return model.state_dict()


# ----------------------------------------------------------------------------------------------------------------
# the saves

def accelerate_save_model(model, out, rank, index):
    """accelerate 1.14 save_fsdp_model for LOCAL_STATE_DICT."""
    import torch
    name = f"pytorch_model_fsdp_rank{rank}.bin" if index == 0 else f"pytorch_model_fsdp_{index}_rank{rank}.bin"
    sd = fsdp1_local(model)
    torch.save(sd, os.path.join(out, name))
    return sd


def accelerate_save_optimizer(model, optimizer, out, index):
    """accelerate 1.14 save_fsdp_optimizer for a state dict type other than FULL: FSDP.optim_state_dict under
    the LOCAL_STATE_DICT context, written with torch.distributed.checkpoint into optimizer_{index}/."""
    import torch.distributed.checkpoint as dist_cp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        optim_state = FSDP.optim_state_dict(model, optimizer)
        ckpt_dir = os.path.join(out, f"optimizer_{index}")
        os.makedirs(ckpt_dir, exist_ok=True)
        dist_cp.save(state_dict={"optimizer": optim_state}, storage_writer=dist_cp.FileSystemWriter(ckpt_dir),
                     planner=DefaultSavePlanner())


def rng_states():
    import numpy as np
    import torch
    return {"random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
            "torch_manual_seed": torch.get_rng_state()}


class Run:
    """One case on one rank."""

    def __init__(self, name, rank, ws, out):
        import torch.distributed as dist
        self.name, self.rank, self.ws, self.out = name, rank, ws, out
        self.s = CASES[name]
        self.dist = dist
        self.ckpt = os.path.join(out, "checkpoint")
        self.info = {"losses": [], "views": []}

    def barrier(self):
        self.dist.barrier()

    def model(self, dims, seed):
        import torch
        model, config, layer = make_model(dims, self.s["dtype"], seed)
        if self.s["kind"] == "fsdp2":
            model = wrap_fsdp2(model, self.ws)
        else:
            model = wrap_fsdp1(model, layer, self.s)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.5, total_iters=10)
        return model, config, optimizer, scheduler

    def write_config(self, config, folder):
        if self.rank == 0 and config is not None and self.s["config"]:
            config.save_pretrained(folder)

    def expect_fsdp1(self, model, sd, sub, golden_source):
        """The golden and flat expectations of an FSDP1 save (collective)."""
        snap = fsdp1_snapshot(model, sd)
        golden = fsdp1_golden(model)
        if self.rank != 0:
            return
        exp = os.path.join(self.out, "expected", sub)
        write_tensors(exp, "full_state_dict", golden, golden_source)
        flat = dict(snap["flat"])
        flat.update(snap["plain"][0])
        write_tensors(exp, "flat_params", flat, "every unit's flat parameter: the live sharded FlatParameters of all "
                      "ranks gathered and concatenated in rank order, cut to FlatParameter._unpadded_unsharded_size "
                      "(== the ShardedTensors' local shards concatenated); plus the rank files' plain tensors")
        layout = snap["layout"]
        self.info["views"].append({
            "tag": sub or None, "expected": os.path.join("expected", sub).rstrip("/"),
            "golden_names": list(golden), "golden_dtypes": sorted({str(v.dtype) for v in golden.values()}),
            "unit_keys": [u["key"] for u in layout], "flat_keys": list(flat),
            "live_flat_param_layout": layout, "reference_selfcheck": selfcheck(snap, golden),
            "features_found": check_features(self.name, [] if self.info["views"] else self.s["features"],
                                             self.s["orig"], snap),
            "lm_head_in_full_state_dict": "lm_head.weight" in golden,
            "rank_file_contents": snap["contents"]})
        assert self.info["views"][-1]["reference_selfcheck"]["ok"], self.info["views"][-1]["reference_selfcheck"]

    # --- kinds

    def fsdp1(self):
        import torch
        s = self.s
        model, config, optimizer, _ = self.model(s, s["seed"])
        train(model, optimizer, None, s["steps"][-1], s, s["seed"], self.rank, self.info["losses"])
        os.makedirs(self.ckpt, exist_ok=True)
        sd = fsdp1_local(model)
        torch.save(sd, os.path.join(self.ckpt, rank_file(s, self.rank)))
        self.write_config(config, self.ckpt)
        self.barrier()
        self.expect_fsdp1(model, sd, "", "FSDP1 FULL_STATE_DICT (FullStateDictConfig(offload_to_cpu=True, "
                          "rank0_only=True)) of the same wrapped model right after the LOCAL_STATE_DICT save, rank 0")
        if self.name == TAMPERED_CASE:
            tampered = os.path.join(self.out, "tampered")
            os.makedirs(tampered, exist_ok=True)
            torch.save(tampered_state_dict(model, self.rank), os.path.join(tampered, rank_file(s, self.rank)))
        self.info["save_call"] = ("with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT): "
                                  f"torch.save(model.state_dict(), '{s['naming']}')  # on every rank")

    def accelerate(self):
        import torch
        s = self.s
        models = [self.model(s, s["seed"])]
        if s.get("second"):
            models.append(self.model(dict(s["second"]), s["seed"] + 1))
        for (m, _, opt, sch), dims in zip(models, [s, s.get("second")]):
            train(m, opt, sch, s["steps"][-1], dims, s["seed"], self.rank, self.info["losses"])
        os.makedirs(self.ckpt, exist_ok=True)
        # Accelerator.save_state: every model, then every optimizer, then schedulers and RNG states
        sds = [accelerate_save_model(m, self.ckpt, self.rank, i) for i, (m, _, _, _) in enumerate(models)]
        for i, (m, _, opt, _) in enumerate(models):
            accelerate_save_optimizer(m, opt, self.ckpt, i)
        if self.rank == 0:
            for i, (_, _, _, sch) in enumerate(models):
                torch.save(sch.state_dict(), os.path.join(self.ckpt, "scheduler.bin" if i == 0 else
                                                          f"scheduler_{i}.bin"))
        torch.save(dict(step=0, **rng_states()), os.path.join(self.ckpt, f"random_states_{self.rank}.pkl"))
        self.write_config(models[0][1], self.ckpt)
        self.barrier()
        for i, ((m, _, _, _), sd) in enumerate(zip(models, sds)):
            self.expect_fsdp1(m, sd, "" if i == 0 else f"model_{i}",
                              f"FSDP1 FULL_STATE_DICT (FullStateDictConfig(offload_to_cpu=True, rank0_only=True)) of "
                              f"model {i} right after the reproduced Accelerator.save_state, rank 0")
        self.info["save_call"] = ("Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1, "
                                  "state_dict_type='LOCAL_STATE_DICT', ...)).save_state(checkpoint)  # accelerate "
                                  "1.14, reproduced: save_fsdp_model per model, save_fsdp_optimizer per optimizer, "
                                  "scheduler.bin, random_states_{R}.pkl")

    def trainer(self):
        import torch
        from transformers.trainer_callback import TrainerState
        s = self.s
        model, config, optimizer, scheduler = self.model(s, s["seed"])
        done, log = 0, []
        for step in s["steps"]:
            train(model, optimizer, scheduler, step - done, s, s["seed"], self.rank, self.info["losses"])
            done = step
            out = os.path.join(self.ckpt, f"checkpoint-{step}")
            os.makedirs(out, exist_ok=True)
            # Trainer._save_checkpoint with FSDP and a state dict type other than FULL: save_model writes nothing,
            # _save_optimizer_and_scheduler calls accelerate's save_fsdp_model and save_fsdp_optimizer, then
            # scheduler.pt; rng_state_{R}.pth per process; trainer_state.json
            sd = accelerate_save_model(model, out, self.rank, 0)
            accelerate_save_optimizer(model, optimizer, out, 0)
            if self.rank == 0:
                torch.save(scheduler.state_dict(), os.path.join(out, "scheduler.pt"))
            import numpy as np
            torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
                       os.path.join(out, f"rng_state_{self.rank}.pth"))
            if self.rank == 0:
                log.append({"epoch": 0.0, "step": step, "loss": self.info["losses"][-1],
                            "learning_rate": scheduler.get_last_lr()[0]})
                TrainerState(global_step=step, max_steps=s["steps"][-1], save_steps=2, logging_steps=1,
                             train_batch_size=2, log_history=list(log)).save_to_json(
                    os.path.join(out, "trainer_state.json"))
            self.write_config(config, out)
            self.barrier()
            self.expect_fsdp1(model, sd, f"checkpoint-{step}",
                              f"FSDP1 FULL_STATE_DICT (FullStateDictConfig(offload_to_cpu=True, rank0_only=True)) "
                              f"right after checkpoint-{step} was saved, rank 0")
        self.info["save_call"] = ("HF Trainer._save_checkpoint with FSDP LOCAL_STATE_DICT (transformers 5.12, "
                                  "reproduced): accelerate's save_fsdp_model + save_fsdp_optimizer, scheduler.pt, "
                                  "rng_state_{R}.pth, trainer_state.json per checkpoint-N")

    def fsdp2(self):
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.tensor import DTensor
        s = self.s
        model, config, optimizer, _ = self.model(s, s["seed"])
        train(model, optimizer, None, s["steps"][-1], s, s["seed"], self.rank, self.info["losses"])
        os.makedirs(self.ckpt, exist_ok=True)
        sd = model.state_dict()
        torch.save(sd, os.path.join(self.ckpt, rank_file(s, self.rank)))
        self.write_config(config, self.ckpt)
        self.barrier()
        golden = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # every local tensor is torch.chunk's dim-0 piece of the full one
        for k, v in sd.items():
            full = v.full_tensor() if isinstance(v, DTensor) else v
            chunks = list(torch.chunk(full, self.ws, 0))
            chunks += [full[:0]] * (self.ws - len(chunks))
            local = v._local_tensor if isinstance(v, DTensor) else v
            assert torch.equal(local, chunks[self.rank] if isinstance(v, DTensor) else full), k
        if self.rank == 0:
            write_tensors(os.path.join(self.out, "expected"), "full_state_dict", golden,
                          "FSDP2 get_model_state_dict(model, StateDictOptions(full_state_dict=True, cpu_offload=True)) "
                          "of the same sharded model right after the per-rank save, rank 0")
            self.info["views"].append({
                "tag": None, "expected": "expected", "golden_names": list(golden),
                "golden_dtypes": sorted({str(v.dtype) for v in golden.values()}),
                "lm_head_in_full_state_dict": "lm_head.weight" in golden,
                "names_sharing_lm_head_storage_in_rank_files": [
                    k for k in sd if k != "lm_head.weight" and "lm_head.weight" in sd
                    and sd[k]._local_tensor.untyped_storage().data_ptr()
                    == sd["lm_head.weight"]._local_tensor.untyped_storage().data_ptr()],
                "fsdp2_placements_rank0": {k: describe_value(v) for k, v in sd.items()}})
        self.info["save_call"] = (f"torch.save(model.state_dict(), '{s['naming']}')  # on every rank, FSDP2 "
                                  "fully_shard model (each decoder layer, then the root; DTensor parameters)")

    def finish(self, seconds):
        import torch
        import transformers
        losses = gather0(self.info.pop("losses"))
        if self.rank != 0:
            return
        s = self.s
        info = {"generator_version": GEN_VERSION, "case": self.name, "settings": s,
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "python": sys.version.split()[0]},
                "backend": "gloo on 127.0.0.1, CPU, USE_LIBUV=0, OMP_NUM_THREADS=1",
                "mount": "checkpoint/", "rank_files": [rank_file(s, r) for r in range(self.ws)],
                "config_json": ("model.config.save_pretrained(checkpoint) added by the generator (neither a plain "
                                "torch.save, accelerate's save_state nor Trainer's FSDP LOCAL_STATE_DICT checkpoint "
                                "writes it)") if s["config"] else "none (no config.json: names cannot be known)",
                "losses_per_rank": losses, "seconds": round(seconds, 1),
                "checkpoint_files": file_list(self.ckpt), **self.info}
        with open(os.path.join(self.out, "case.json"), "w") as f:
            json.dump(info, f, indent=1)


def gloo_bfloat16():
    """gloo has no bfloat16 collectives ("Invalid scalar type"): the all-gathers FSDP unshards bf16 flat parameters
    with (and MixedPrecision's bf16 copies) move the same bits as uint8, the gradient reduce-scatter of a bf16 model
    sums in float32 and rounds once.  Only the transport changes: what FSDP stores and saves is its own."""
    import torch
    import torch.distributed as dist
    all_gather, all_gather_single, reduce_scatter_single = (dist.all_gather, dist.all_gather_single,
                                                            dist.reduce_scatter_single)

    def as_bytes(t):
        return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t

    def gather_list(tensor_list, tensor, group=None, async_op=False):
        return all_gather([as_bytes(t) for t in tensor_list], as_bytes(tensor), group=group, async_op=async_op)

    def gather_single(output, input, group=None, async_op=False):
        return all_gather_single(as_bytes(output), as_bytes(input), group=group, async_op=async_op)

    def reduce_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if output.dtype != torch.bfloat16:
            return reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)
        assert not async_op
        out32 = output.float()
        reduce_scatter_single(out32, input.float(), op=op, group=group)
        output.copy_(out32)
        return None

    dist.all_gather, dist.all_gather_single, dist.reduce_scatter_single = gather_list, gather_single, reduce_single


def worker(rank, ws, names, out_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    gloo_bfloat16()
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    for name in names:
        t0 = time.time()
        out = os.path.join(out_dir, name)
        if rank == 0:
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
        dist.barrier()
        run = Run(name, rank, ws, out)
        getattr(run, CASES[name]["kind"])()
        dist.barrier()
        run.finish(time.time() - t0)
        dist.barrier()
        if rank == 0:
            print(f"generate_fsdp_local: {name} written ({time.time() - t0:.1f} s)", flush=True)
    dist.destroy_process_group()


def main():
    out_dir, names = cases_to_generate(__doc__, CASES, GEN_VERSION)
    import torch.multiprocessing as mp
    t0 = time.time()
    for ws in sorted({CASES[n]["ws"] for n in names}):
        group = [n for n in names if CASES[n]["ws"] == ws]
        mp.start_processes(worker, args=(ws, group, out_dir, free_port()), nprocs=ws, start_method="spawn")
    print(f"generate_fsdp_local: {len(names)} case(s) in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
