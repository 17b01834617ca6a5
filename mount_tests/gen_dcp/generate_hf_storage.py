#!/usr/bin/python3
"""Writes checkpoints with PyTorch's own HuggingFaceStorageWriter (torch.distributed.checkpoint, torch 2.14,
gloo on a CPU mesh of 2 ranks) plus the full tensors they hold, computed before anything was sharded.  Runs
INSIDE the Debian unstable chroot (python3-torch 2.14); on the host, test_dcp_hf_storage.py runs it through
run_generator.generate(suite=...).

    python3 generate_hf_storage.py OUT_DIR [--only NAME ...] [--force]

Per case OUT_DIR/<case>/ (hf_storage_cases.py lists them):
  checkpoint/  what the writer left, plus the config.json a training script saves beside it
  expected/    model.pt: name -> full tensor, from the seeded generator (never from the checkpoint), in the
               order docs/formats/dcp.md gives (files in natural order; per file DCP_SHARDING_INFO's order,
               else data-offset order); fp32.pt: the same, float16/bfloat16 upcast
  case.json    layout, files, model names, and the cross-check: PyTorch's HuggingFaceStorageReader (through
               _load_state_dict, as dcp_to_torch_save would) reads back exactly the expected tensors
The step-dir case (torchtitan) has expected/<step>/ and case.json's tag_info per step, in test_dcp.py's
schema: its DCP step by generate_dcp.expect_tag (dcp_to_torch_save), its HF step as above.
Ranks are separate processes spawned by generate_dcp.run_workers (no torch.multiprocessing: a bare chroot).
"""
import json
import os
import shutil
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))  # in the tree; in the chroot, case_cache.py is copied beside this
import generate_dcp as G  # noqa: E402
from case_cache import cases_to_generate  # noqa: E402
from hf_storage_cases import CASES, GEN_VERSION  # noqa: E402

CONFIG = {"model_type": "llama", "hidden_size": 36, "vocab_size": 101}


def tensors(float_only, seed=2024):
    """name -> (full tensor, placement on the mesh of 2): 'S<d>' Shard(d), 'R' Replicate, 'plain' a plain
    tensor on every rank.  Seeded, so every rank makes the same ones."""
    import torch
    g = torch.Generator().manual_seed(seed)

    def r(*shape, dtype=torch.float32):
        return (torch.randn(*shape, generator=g) * 0.2).to(dtype)

    bf, f16 = torch.bfloat16, torch.float16
    out = {
        "model.embed_tokens.weight": (r(101, 36), "S0"),                      # 51 + 50 rows
        "model.layers.0.self_attn.q_proj.weight": (r(36, 36, dtype=bf), "S1"),
        "model.layers.0.mlp.up_proj.weight": (r(53, 36, dtype=f16), "S0"),    # 27 + 26 rows
        "model.layers.0.mlp.down_proj.weight": (r(36, 53, dtype=bf), "S1"),   # 27 + 26 columns
        "model.layers.0.kernel": (r(4, 6, 5), "S2"),                          # 3-D, 3 + 2
        "model.norm.weight": (1 + r(36), "R"),
        "model.extra.row": (r(1, 8), "S0"),                                   # rank 2's chunk is empty
        "lm_head.weight": (r(101, 36, dtype=bf), "S0"),
    }
    if not float_only:  # consolidate_safetensors_files sizes elements with torch.finfo: floats only
        out["model.step"] = (torch.tensor([3, 2 ** 40 + 1, -7], dtype=torch.int64), "plain")
        out["model.scale"] = (torch.tensor(1.5), "plain")  # 0-dim
    return out


def save_expected(ctx, full, folder="expected"):
    import torch
    if ctx.rank == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save({k: t for k, (t, _) in full.items()}, f"{folder}/full.pt")


def dtensor_state(ctx, full):
    """The state dict of `full` distributed over a 1-D mesh of 2 (distribute_tensor; every rank cuts its own
    shard, src_data_rank=None: gloo cannot scatter 16-bit floats)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = ctx.mesh((2,))
    sd = {}
    for name, (t, where) in full.items():
        if where == "plain":
            sd[name] = t.clone()
        else:
            placement = Replicate() if where == "R" else Shard(int(where[1:]))
            sd[name] = distribute_tensor(t.clone(), mesh, [placement], src_data_rank=None)
    return sd


def two_files(names):
    """fqn_to_index_mapping: the first half of the tensors in file 1, the rest in file 2."""
    names = list(names)
    return {n: 1 + (i >= len(names) // 2) for i, n in enumerate(names)}


def write_config(ctx, folder="checkpoint"):
    if ctx.rank == 0:
        with open(f"{folder}/config.json", "w") as f:
            json.dump(CONFIG, f, indent=2)


def case_hf_distributed_ws2(ctx):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    full = tensors(float_only=False)
    save_expected(ctx, full)
    sd = dtensor_state(ctx, full)
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter("checkpoint", save_distributed=True,
                                                         fqn_to_index_mapping=two_files(sd)))
    write_config(ctx)
    return {"description": "DTensors (distribute_tensor) on a mesh of 2: Shard(0), Shard(1) (uneven), Shard(2) of a "
                           "3-D tensor, Replicate, plain int64 and 0-dim tensors; fp32/bf16/fp16; "
                           "HuggingFaceStorageWriter(save_distributed=True, fqn_to_index_mapping: 2 files)"}


def case_hf_consolidated_ws2(ctx):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    full = tensors(float_only=True)
    save_expected(ctx, full)
    model = G.make_module([(n, t.clone(), "param") for n, (t, _) in full.items()])
    units = sorted({n.rpartition(".")[0] for n in full}, key=lambda u: -u.count("."))  # leaves first
    G.fsdp2(model, ctx.mesh((2,)), units)
    sd = get_model_state_dict(model)
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter("checkpoint", save_distributed=True,
                                                         enable_consolidation=True,
                                                         fqn_to_index_mapping=two_files(sd)))
    write_config(ctx)
    return {"description": "real FSDP2 fully_shard per module (one dtype each: fp32/bf16/fp16) on a mesh of 2; "
                           "get_model_state_dict; HuggingFaceStorageWriter(save_distributed=True, "
                           "enable_consolidation=True, fqn_to_index_mapping: 2 files): rank 0 consolidates "
                           "sharded/ into model-0000I-of-00002.safetensors + model.safetensors.index.json"}


def case_hf_full_rank0_ws2(ctx):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    full = tensors(float_only=False)
    save_expected(ctx, full)
    if ctx.rank == 0:  # the full tensors are there already (gloo cannot all-gather 16-bit floats)
        sd = {k: t.clone() for k, (t, _) in full.items()}
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter("checkpoint", fqn_to_index_mapping=two_files(sd)),
                 no_dist=True)
    write_config(ctx)
    return {"description": "a full state dict on rank 0 alone: dcp.save(no_dist=True, "
                           "HuggingFaceStorageWriter(fqn_to_index_mapping: 2 files)): model-0000I-of-00002.safetensors "
                           "(zero saved_offsets) + model.safetensors.index.json"}


def case_hf_torchtitan_like_ws2(ctx):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    step10 = tensors(float_only=True, seed=10)
    dcp.save(dtensor_state(ctx, step10), checkpoint_id="checkpoint/step-10")
    step20 = tensors(float_only=True, seed=20)
    save_expected(ctx, step20, "expected/step-20")
    sd = dtensor_state(ctx, step20)
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter("checkpoint/step-20", save_distributed=True,
                                                         enable_consolidation=True,
                                                         fqn_to_index_mapping=two_files(sd)))
    write_config(ctx, "checkpoint/step-20")
    return {"description": "torchtitan's CheckpointManager with last_save_in_hf: checkpoint/step-10/ by dcp.save "
                           "(the model's DTensors at the top level), the last step checkpoint/step-20/ by "
                           "HuggingFaceStorageWriter(save_distributed=True, enable_consolidation=True, "
                           "fqn_to_index_mapping: 2 files)"}


BUILDERS = {name: globals()["case_" + name] for name in CASES}


# --------------------------------------------------------------------------------------------------
# coordinator side

def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))  # keeps the file's key order


def served_order(data_dir):
    """The tensor order of docs/formats/dcp.md: files in natural order; per file DCP_SHARDING_INFO's order,
    else data-offset order; each name where it is first seen."""
    order = []
    files = sorted((f for f in os.listdir(data_dir) if f.endswith(".safetensors")), key=G.natural_key)
    for f in files:
        h = safetensors_header(os.path.join(data_dir, f))
        info = h.get("__metadata__", {}).get("DCP_SHARDING_INFO")
        names = list(json.loads(info)) if info else sorted((k for k in h if k != "__metadata__"),
                                                           key=lambda k: h[k]["data_offsets"][0])
        order += [n for n in names if n not in order]
    return order, files


def same_bits(a, b):
    import torch
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


def read_with_pytorch(ck):
    """HuggingFaceStorageReader through _load_state_dict (dcp_to_torch_save's own body)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    sd = {}
    _load_state_dict(sd, storage_reader=HuggingFaceStorageReader(ck), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return sd


def expect_hf_dir(case_dir, rel, exp_rel):
    """Expectations of one HF storage dir case_dir/rel, whose full tensors the ranks saved in exp_rel/full.pt:
    expected model.pt/fp32.pt and the tag's facts (the keys of generate_dcp.expect_tag, for test_dcp's readers)."""
    import torch
    ck, exp = os.path.join(case_dir, rel), os.path.join(case_dir, exp_rel)
    full = torch.load(os.path.join(exp, "full.pt"), weights_only=True)
    os.unlink(os.path.join(exp, "full.pt"))
    order, files = served_order(ck)
    assert set(order) == set(full), f"{ck}: the files hold {sorted(order)}, the generator made {sorted(full)}"
    model = {k: full[k].contiguous() for k in order}
    torch.save(model, os.path.join(exp, "model.pt"))
    torch.save(G.to_fp32(model), os.path.join(exp, "fp32.pt"))
    theirs = read_with_pytorch(ck)
    bad = [k for k in model if k not in theirs or not same_bits(theirs[k], model[k])]
    assert not bad and set(theirs) == set(model), f"{ck}: HuggingFaceStorageReader disagrees on {bad}"
    sharded = os.path.join(ck, "sharded")
    return {"path": rel, "expected": exp_rel, "full_state": {}, "model_names": order, "data_files": files,
            "reader_equal": True,
            "side_files": sorted(f for f in os.listdir(ck) if os.path.isfile(os.path.join(ck, f)) and f not in files),
            "sharded_files": sorted(os.listdir(sharded)) if os.path.isdir(sharded) else []}


def finish_case(name, case_dir):
    import torch
    ws, layout = CASES[name]
    info = {"name": name, "generator_version": GEN_VERSION, "torch_version": torch.__version__,
            "python_version": sys.version.split()[0], "world_size": ws, "layout": layout, "src": "checkpoint"}
    for r in range(ws):
        p = os.path.join(case_dir, f".gen_info_rank{r}.json")
        with open(p) as f:
            info.update({k: v for k, v in json.load(f).items() if k != "save_seconds"})
        os.unlink(p)
    if layout != "step_dirs":
        info.update(expect_hf_dir(case_dir, "checkpoint", "expected"))
        return info
    info["tag_info"] = {"step-10": G.expect_tag(case_dir, "checkpoint/step-10", "expected/step-10"),
                        "step-20": expect_hf_dir(case_dir, "checkpoint/step-20", "expected/step-20")}
    info["tags"], info["latest"] = ["step-10", "step-20"], "step-20"
    return info


def main(argv=None):
    out_dir, todo = cases_to_generate(__doc__, CASES, GEN_VERSION, argv)
    work = os.path.join(out_dir, f".tmp-hf-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, ".logs"))
    t0 = time.time()
    try:
        for n in todo:
            os.makedirs(os.path.join(work, n))
        G.run_workers(todo, 2, work, os.path.join(work, ".logs"), script=os.path.abspath(__file__))
        for n in todo:
            G.publish_case(os.path.join(work, n), finish_case(n, os.path.join(work, n)), out_dir, n)
            print(f"generate_hf_storage: {n} done", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"generate_hf_storage: {len(todo)} case(s) in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    G.entry_point(main, BUILDERS)
