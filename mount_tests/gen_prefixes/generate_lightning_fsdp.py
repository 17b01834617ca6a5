#!/usr/bin/python3
"""Writes what PyTorch Lightning's FSDPStrategy(state_dict_type="sharded") saves, with the real torch FSDP and
torch.distributed.checkpoint of the Debian unstable chroot (torch 2.14, transformers 5; gloo on 2 CPU ranks,
USE_LIBUV=0).  Runs INSIDE the chroot; on the host, mount_tests/test_prefixes.py runs it through
gen_dcp/run_generator.generate(suite=FSDP_SUITE), which copies this file, lightning_state.py,
gen_dcp/generate_dcp.py and dcp_cases.py, case_cache.py and llama_layout.py into the chroot.

    python3 generate_lightning_fsdp.py OUT_DIR [--only NAME ...] [--force]

Lightning itself is not in the chroot: its calls are made here as Lightning 2.5 makes them
(lightning/pytorch/strategies/fsdp.py, lightning/fabric/strategies/fsdp.py):
- the LightningModule (here a torch module holding a transformers LlamaForCausalLM as ``self.model``, as a
  LightningModule that wraps an HF model does) is wrapped whole: ``FullyShardedDataParallel(module=model,
  cpu_offload=None, mixed_precision=<FSDPPrecision("32-true")>: MixedPrecision(float32, float32, float32),
  sharding_strategy=FULL_SHARD, device_id=<root device>, auto_wrap_policy={LlamaDecoderLayer},
  use_orig_params=True)`` (FSDPStrategy._setup_model; ``kwargs.setdefault("use_orig_params", True)``;
  precision "32-true" as gloo has no bfloat16 collectives);
- a few real AdamW steps (the LightningModule's configure_optimizers over the FSDP parameters);
- save_checkpoint: the model's and optimizer's state under ``FSDP.state_dict_type(model,
  SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=True), ShardedOptimStateDictConfig(
  offload_to_cpu=True))`` (fabric's _get_sharded_state_dict_context): ``{"model": model.state_dict(),
  "optimizer_0": FSDP.optim_state_dict(model, optimizer)}`` saved by ``torch.distributed.checkpoint.save(
  converted_state, checkpoint_id=path)`` (fabric's _distributed_checkpoint_save, torch >= 2.3), then on rank
  0 the rest of the Lightning checkpoint (``dump_checkpoint()`` less ``state_dict`` and
  ``optimizer_states``) ``torch.save``d to ``path/meta.pt`` (fabric/utilities/load.py _METADATA_FILENAME;
  cloud_io._atomic_save streams torch.save into the file);
- ``path`` is ModelCheckpoint's ``lightning_logs/version_0/checkpoints/epoch=0-step=3.ckpt``, a directory.
A user who wants ``from_pretrained`` puts the HF config beside it: rank 0 writes
``model.config.save_pretrained(path)`` (config.json).

Per case OUT_DIR/<case>/: ``checkpoint/...`` as above (``src`` in case.json), ``expected/model.pt``: FSDP's
own FULL_STATE_DICT (FullStateDictConfig(offload_to_cpu=True, rank0_only=True)) of the same model right after
the save, under the HF model's own names (the LightningModule's ``model.`` taken off: what
``LlamaForCausalLM.state_dict()`` holds, checked against an unwrapped model's keys), ``expected/fp32.pt``
(the same: the parameters are float32), and case.json (``prefix`` "model.", the meta.pt sha256 and size,
the .metadata keys).  Cross-check: PyTorch's own reader (format_utils.dcp_to_torch_save) reads the DCP dir
back to exactly FULL_STATE_DICT's tensors under ``model``.
"""
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "gen_dcp"))  # in the tree; in the chroot, copied beside
sys.path.append(os.path.dirname(HERE))
import generate_dcp as G  # noqa: E402 (ranks as processes, gloo, publish_case)
from case_cache import cases_to_generate  # noqa: E402
from lightning_state import ckpt_path, lightning_state  # noqa: E402

GEN_VERSION = 1  # bump to invalidate cached fixtures (build/fixtures-prefixes)
STEPS = 3
CKPT = "checkpoint/" + ckpt_path(0, STEPS)
PREFIX = "model."  # the LightningModule's attribute holding the HF model
# name -> world size
CASES = {"lightning_fsdp_sharded_ws2": 2}
LLAMA = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, max_position_embeddings=128, head_dim=16, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
# LambdaLR's state_dict after STEPS scheduler steps (configure_optimizers' scheduler, interval "step")
LR_SCHEDULER = {"base_lrs": [0.001], "last_epoch": STEPS, "_step_count": STEPS + 1,
                "_get_lr_called_within_step": False, "_last_lr": [0.001], "lr_lambdas": [None]}


def lit_module(seed):
    """(the LightningModule stand-in holding LlamaForCausalLM as .model, the HF state_dict names) with the same
    weights on every rank."""
    import torch
    import transformers as tf

    class LitLlama(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.model = tf.LlamaForCausalLM(config)

        def forward(self, ids):
            return self.model(input_ids=ids, labels=ids).loss

    torch.manual_seed(seed)
    config = tf.LlamaConfig(**LLAMA)
    config.architectures = ["LlamaForCausalLM"]
    lit = LitLlama(config)
    return lit, list(lit.model.state_dict())


def case_lightning_fsdp_sharded_ws2(ctx):
    import functools
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp.api import ShardedOptimStateDictConfig, ShardedStateDictConfig
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    lit, hf_names = lit_module(31)
    model = FSDP(module=lit, cpu_offload=None,
                 mixed_precision=MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                                buffer_dtype=torch.float32),
                 sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"),
                 auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                    transformer_layer_cls={LlamaDecoderLayer}),
                 use_orig_params=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(7000 + 100 * ctx.rank + step)
        loss = model(torch.randint(3, LLAMA["vocab_size"], (2, 12), generator=g))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(loss.item(), 6))

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=True),
                              ShardedOptimStateDictConfig(offload_to_cpu=True)):
        state_dict = model.state_dict()
        optimizer_state = FSDP.optim_state_dict(model, optimizer)
    types = sorted({type(v).__module__ + "." + type(v).__qualname__ for v in state_dict.values()})
    os.makedirs(CKPT, exist_ok=True)  # _prepare_directory_checkpoint
    dcp.save({"model": state_dict, "optimizer_0": optimizer_state}, checkpoint_id=CKPT)
    if ctx.rank == 0:
        with open(os.path.join(CKPT, "meta.pt"), "wb") as f:
            torch.save(lightning_state(STEPS, "2.5.5", lr=0.001, lr_schedulers=[LR_SCHEDULER]), f)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        full = model.state_dict()
    dist.barrier()
    if ctx.rank != 0:
        return {}
    assert all(k.startswith(PREFIX) for k in full), list(full)
    hf = {k[len(PREFIX):]: v.detach().clone().contiguous() for k, v in full.items()}
    assert list(hf) == hf_names, f"FULL_STATE_DICT names {list(hf)} are not LlamaForCausalLM's {hf_names}"
    assert all(v.dtype == torch.float32 for v in hf.values()), "FSDP keeps float32 parameters"
    os.makedirs("expected")
    torch.save(hf, "expected/model.pt")
    torch.save(G.to_fp32(hf), "expected/fp32.pt")
    lit.model.config.save_pretrained(CKPT)  # config.json, as a user adds it
    return {"losses": losses, "sharded_state_dict_types": types, "world_size": ctx.ws}


BUILDERS = {"lightning_fsdp_sharded_ws2": case_lightning_fsdp_sharded_ws2}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def finish_case(name, case_dir):
    """case.json, and the cross-check with PyTorch's own reader of the DCP dir."""
    import torch
    info = {"name": name, "generator_version": GEN_VERSION, "generator": "generate_lightning_fsdp.py",
            "torch_version": torch.__version__, "python_version": sys.version.split()[0],
            "world_size": CASES[name], "src": CKPT, "prefix": PREFIX,
            "expected": {"model": "expected/model.pt", "fp32": "expected/fp32.pt"}}
    for r in range(CASES[name]):
        p = os.path.join(case_dir, f".gen_info_rank{r}.json")
        with open(p) as f:
            info.update({k: v for k, v in json.load(f).items() if k != "save_seconds"})
        os.unlink(p)
    ck = os.path.join(case_dir, CKPT)
    back = G.expect_dcp_dir(ck, os.path.join(case_dir, ".readback.pt"))
    os.unlink(os.path.join(case_dir, ".readback.pt"))
    model = torch.load(os.path.join(case_dir, "expected", "model.pt"), weights_only=True)
    theirs = back["model"]
    assert set(theirs) == {PREFIX + k for k in model}, f"dcp_to_torch_save's model keys {sorted(theirs)}"
    bad = [k for k, v in model.items() if not (theirs[PREFIX + k].dtype == v.dtype and
                                               torch.equal(theirs[PREFIX + k].view(torch.uint8).reshape(-1),
                                                           v.view(torch.uint8).reshape(-1)))]
    assert not bad, f"the DCP dir does not read back to FULL_STATE_DICT's tensors: {bad}"
    assert set(back) == {"model", "optimizer_0"}, sorted(back)
    info.update(readback_equal=True, top_level_keys=sorted(back), optimizer_state_keys=sorted(back["optimizer_0"]),
                meta_pt={"size": os.path.getsize(os.path.join(ck, "meta.pt")), "sha256": sha256(os.path.join(ck, "meta.pt"))},
                files=sorted(os.listdir(ck)), model_names=list(model))
    return info


def main(argv=None):
    out_dir, todo = cases_to_generate(__doc__, CASES, GEN_VERSION, argv)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-lightning-", dir=out_dir) as work:  # out_dir's file system
        for n in [".logs", *todo]:
            os.makedirs(os.path.join(work, n))
        if todo:
            G.run_workers(todo, 2, work, os.path.join(work, ".logs"), script=os.path.abspath(__file__))
        for n in todo:
            G.publish_case(os.path.join(work, n), finish_case(n, os.path.join(work, n)), out_dir, n)
            print(f"generate_lightning_fsdp: {n} done", flush=True)
    return 0


if __name__ == "__main__":
    G.entry_point(main, BUILDERS)
