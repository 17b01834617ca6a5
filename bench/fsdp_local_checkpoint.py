"""The chroot side of bench/fsdp_local_bench.sh: runs with torch 2.14 and transformers (the Debian unstable
chroot, CKPTFS_SID_CHROOT), never on the host.

  python3 fsdp_local_checkpoint.py generate DIR   save the bench's FSDP1 LOCAL_STATE_DICT checkpoint into DIR
                                                 (a new folder; the bench moves it into place once complete):
                                                 rank{R}.pt for R < 4 and config.json; prints one JSON line
                                                 (the model's parameter count and float32 bytes, the seconds)

The checkpoint is what `torch.save(model.state_dict(), f"rank{R}.pt")` writes on every rank under
`FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT)`, by real FSDP1: 4 ranks (torch.multiprocessing
spawn, gloo on CPU, `device_id=torch.device("cpu")`), transformers' LlamaForCausalLM built from the LlamaConfig
below (float32, seeded, the same on every rank), one FSDP unit per LlamaDecoderLayer plus the root (embeddings,
final norm, lm_head), `use_orig_params=True` and `MixedPrecision(bfloat16)`: flat parameters in float32,
every parameter aligned to 8 elements (16 bytes of bfloat16) and each flat parameter padded to a multiple of 4.
The sizes are odd on purpose (hidden 1036 and intermediate 2771 are not multiples of 8, vocab 32003 is odd):
the norms, the MLP weights and the embeddings are followed by alignment padding. 326.6 M parameters, 1.31 GB
in float32; each rank file holds its quarter of every flat parameter and the use_orig_params pieces (views of
the same storage, saved once). No training step: gloo in this torch refuses 16-bit all-gathers, and the
layout is fixed at wrap time. Peak memory ~1.6 GB per rank (the whole model, then its quarter).
"""

import json
import os
import sys
import time

SPEC_VERSION = "fsdp-local-bench-1"  # bump when the checkpoint below changes: bench/fsdp_local_bench.sh regenerates
WORLD = 4
CONFIG = dict(vocab_size=32003, hidden_size=1036, intermediate_size=2771, num_hidden_layers=22,
              num_attention_heads=14, num_key_value_heads=7, max_position_embeddings=2048,
              tie_word_embeddings=False)


def _generate_rank(rank, directory):
    import functools

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    cfg = LlamaConfig(**CONFIG)
    model = LlamaForCausalLM(cfg)
    fsdp = FSDP(model,
                auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                   transformer_layer_cls={LlamaDecoderLayer}),
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                               buffer_dtype=torch.bfloat16),
                use_orig_params=True, device_id=torch.device("cpu"))
    with FSDP.state_dict_type(fsdp, StateDictType.LOCAL_STATE_DICT):
        torch.save(fsdp.state_dict(), os.path.join(directory, f"rank{rank}.pt"))
    if rank == 0:
        cfg.save_pretrained(directory)
    dist.destroy_process_group()


def generate(directory):
    import torch.multiprocessing as mp

    os.makedirs(directory)  # a new one: what a failed run leaves is never taken for a checkpoint
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("FSDP_BENCH_PORT", "29531"),
                      USE_LIBUV="0", OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    mp.spawn(_generate_rank, args=(directory,), nprocs=WORLD, join=True)
    h, i, v, n = (CONFIG[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    kv = h // CONFIG["num_attention_heads"] * CONFIG["num_key_value_heads"]
    params = 2 * v * h + h + n * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)
    print(json.dumps({"spec": SPEC_VERSION, "params": params, "fp32_bytes": 4 * params,
                      "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "generate":
        sys.exit(__doc__)
    generate(sys.argv[2])
