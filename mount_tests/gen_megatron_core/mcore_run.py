"""One process of a gen_megatron_core case, run inside the Debian unstable chroot (torch 2.14, CPU, gloo) on a
Megatron-LM 2a75ac12c5 checkout.  Megatron does the work: its argument parser and checks, model_provider with
gpt_builder (GPTModel, local layer spec), setup_model_and_optimizer (Float16Module, DDP, the (chained)
optimizer), the optimizer's own step, save_checkpoint and load_checkpoint.

    mcore_run.py save OUT_JSON -- MEGATRON_ARGS...     (one rank of the parallel run; RANK/WORLD_SIZE set)
    mcore_run.py expect OUT_DIR -- MEGATRON_ARGS...    (world size 1, MEGATRON_ARGS with --load: Megatron's own
                                                        load of the parallel save into TP=1 PP=1 EP=1)

save: STEPS optimizer steps (env GEN_STEPS), each on gradients drawn per parameter from a seed of its name and
its tensor/expert rank (the same on every data-parallel replica, so replicas stay equal as Megatron's gradient
all-reduce would keep them), then save_checkpoint at iteration STEPS with the args' --save and --ckpt-format;
with GEN_REFERENCE_SAVE=DIR (the legacy cases) save_checkpoint again into DIR as torch_dist, for `expect` to load.
expect: writes OUT_DIR/full_model.pt (name -> bf16 tensor, megatron-core names, no _extra_state), fp32.pt (the
fp32 masters under the same names, with GEN_MASTERS=1: see saved_masters) and logits.json (GPTModel's forward in fp32
on fixed tokens, the true vocabulary's logits).
"""
import hashlib
import json
import os
import sys
import zlib
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_glue  # noqa: E402,F401  (first: see its docstring)

import torch  # noqa: E402
from megatron.core import dist_checkpointing, mpu  # noqa: E402
from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor  # noqa: E402
from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.training import checkpointing  # noqa: E402
from megatron.training.arguments import parse_args, update_use_dist_ckpt, validate_args  # noqa: E402
from megatron.training.global_vars import get_args, set_global_variables  # noqa: E402
from megatron.training.initialize import _set_random_seed, initialize_megatron  # noqa: E402
from megatron.training.training import setup_model_and_optimizer  # noqa: E402
from megatron.core.utils import get_model_config, unwrap_model  # noqa: E402

cpu_glue.patch_rng_tracker()

from gpt_builders import gpt_builder  # noqa: E402  (Megatron-LM's top level: PYTHONPATH)
from model_provider import model_provider  # noqa: E402

TOKENS_SEED = 1234
# Another fp32 forward pass of the same bf16 weights (transformers') differs from Megatron's by fp32 rounding
# alone, in a different order of operations (fused QKV, rope, softmax, RMSNorm): a few ulps (1.2e-7) relative per
# operation over a few layers; 1e-5 of the largest logit leaves room for that, no more (README.md: measured).
LOGITS_RTOL = 1e-5


def initialize(argv):
    """initialize_megatron's steps for a CPU process: its own (rerun state machine, logging) with
    allow_no_cuda, then torch.distributed (gloo) and mpu.initialize_model_parallel as _initialize_distributed
    would call them with a GPU (it skips them without one), then _set_random_seed."""
    sys.argv = ["pretrain_gpt.py"] + argv
    args = parse_args()
    validate_args(args, {})
    set_global_variables(args)
    initialize_megatron(allow_no_cuda=True, skip_mpu_initialization=True)
    torch.distributed.init_process_group(backend="gloo", world_size=args.world_size, rank=args.rank)
    mpu.initialize_model_parallel(
        args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
        args.virtual_pipeline_model_parallel_size,
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        create_gloo_process_groups=args.use_gloo_process_groups)
    _set_random_seed(args.seed, args.data_parallel_random_init)
    return get_args()


def build():
    model, optimizer, scheduler = setup_model_and_optimizer(ModelType.encoder_or_decoder,
                                                            partial(model_provider, gpt_builder))
    return model, optimizer, scheduler


def gradient_seed(name, param):
    """A gradient's seed: its name, plus the rank of the slice it holds along tensor / expert parallelism."""
    expert = not getattr(param, "allreduce", True)
    tp = 0
    if getattr(param, "tensor_model_parallel", False):
        tp = mpu.get_expert_tensor_parallel_rank() if expert else mpu.get_tensor_model_parallel_rank()
    ep = mpu.get_expert_model_parallel_rank() if expert else 0
    pp = mpu.get_pipeline_model_parallel_rank()
    return zlib.crc32(f"{name}|pp{pp}|tp{tp}|ep{ep}".encode())


def count_tokens(model, step):
    """With --moe-router-enable-expert-bias: each router's tokens per expert, drawn as the gradients are (the
    forward pass would count them), then Megatron's own aux-loss-free bias update (finalize_model_grads').
    The counts are kept in fp32 (Float16Module made the buffer bf16, which gloo cannot all-reduce; counts under 256
    are the same numbers), the bias too, as the router's forward does first (_maintain_float32_expert_bias)."""
    routers = [(n, m) for chunk in model for n, m in chunk.named_modules()
               if getattr(m, "local_tokens_per_expert", None) is not None]
    for name, router in routers:
        seed = zlib.crc32(f"{name}|pp{mpu.get_pipeline_model_parallel_rank()}".encode()) + step
        g = torch.Generator().manual_seed(seed)
        shape = router.local_tokens_per_expert.shape
        router.local_tokens_per_expert.data = torch.randint(0, 64, shape, generator=g).float()
        router._maintain_float32_expert_bias()
    if routers:
        _update_router_expert_bias(model, get_model_config(model[0]))


def train(model, optimizer, scheduler, steps):
    for step in range(steps):
        for chunk in model:
            chunk.zero_grad_buffer()
            for name, p in chunk.named_parameters():
                g = torch.Generator().manual_seed(gradient_seed(name, p) + step)
                p.main_grad.copy_(torch.randn(p.shape, generator=g) * 0.01)
        count_tokens(model, step)
        ok, grad_norm, _ = optimizer.step()
        assert ok, f"optimizer step {step} skipped"
        scheduler.step(increment=get_args().global_batch_size)
        print(f"rank {torch.distributed.get_rank()}: step {step + 1} grad norm {grad_norm}", flush=True)


def save(out_json, argv):
    args = initialize(argv)
    model, optimizer, scheduler = build()
    steps = int(os.environ.get("GEN_STEPS", "2"))
    train(model, optimizer, scheduler, steps)
    checkpointing.save_checkpoint(steps, model, optimizer, scheduler, 0)
    reference = os.environ.get("GEN_REFERENCE_SAVE")
    if reference:  # a legacy save cannot be loaded at another TP / PP: the same state again, as torch_dist
        args.save, args.ckpt_format = reference, "torch_dist"
        update_use_dist_ckpt(args)
        checkpointing.save_checkpoint(steps, model, optimizer, scheduler, 0)
    torch.distributed.barrier()
    if args.rank == 0:
        with open(out_json, "w") as f:
            json.dump({"iteration": steps, "padded_vocab_size": args.padded_vocab_size}, f)


def saved_masters(core, checkpoint_dir):
    """name -> fp32 master, read by megatron-core's dist_checkpointing.load from the save's
    optimizer.state.fp32_param.<key> tensors (the keys the non-distributed optimizer declares them under:
    make_sharded_optimizer_tensor over the model's own sharded state dict, here at TP=1 PP=1 EP=1)."""
    def fp32(sh):
        return make_sharded_optimizer_tensor(sh, torch.empty(sh.local_shape if hasattr(sh, "local_shape") else
                                                             sh.data.shape, dtype=torch.float32),
                                             "optimizer.state.fp32_param")
    wanted = {k: fp32(v) for k, v in core.sharded_state_dict().items() if not k.endswith("_extra_state")}
    loaded = dist_checkpointing.load(wanted, checkpoint_dir)
    return {k: loaded[k] for k in wanted}  # load() also hands back the save's common state (args ...)


def write_manifest(full, args, path):
    """name -> shape, dtype, sha256 of the raw bytes, like the real fixtures' manifest.json."""
    tensors = {}
    for k, t in full.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        tensors[k] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "nbytes": len(raw),
                      "sha256": hashlib.sha256(raw).hexdigest()}
    meta = {"method": "Megatron-LM 2a75ac12c5 load_checkpoint() into a world-size-1 GPTModel (TP=1 PP=1 EP=1, local "
                      "spec, the same model args), then model.state_dict() without _extra_state",
            "iteration": args.iteration, "num_tensors": len(tensors),
            "sha256_of": "raw little-endian bytes of the contiguous tensor (row-major)", "mount_src": "checkpoint"}
    with open(path, "w") as f:
        json.dump({"_meta": meta, "tensors": tensors}, f, indent=1)


def expect(out_dir, argv):
    args = initialize(argv)
    assert args.world_size == 1 and args.load
    model, _, _ = build()
    assert args.iteration > 0, f"nothing loaded from {args.load}"
    core = unwrap_model(model[0])
    full = {k: v.detach().clone() for k, v in core.state_dict().items() if not k.endswith("_extra_state")}
    os.makedirs(out_dir, exist_ok=True)
    torch.save(full, os.path.join(out_dir, "full_model.pt"))
    write_manifest(full, args, os.path.join(out_dir, "manifest.json"))
    if os.environ.get("GEN_MASTERS") == "1":
        iteration_dir = checkpointing.get_checkpoint_name(args.load, args.iteration, release=False,
                                                          return_base_dir=True)
        torch.save(saved_masters(core, iteration_dir), os.path.join(out_dir, "fp32.pt"))
    true_vocab = args.vocab_size
    tokens = torch.randint(0, true_vocab, (2, 12), generator=torch.Generator().manual_seed(TOKENS_SEED))
    core = core.float().eval()
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    with torch.no_grad():
        logits = core(tokens, positions, None)
    logits = logits[..., :true_vocab].double()
    atol = LOGITS_RTOL * max(1.0, logits.abs().max().item())
    with open(os.path.join(out_dir, "logits.json"), "w") as f:
        json.dump({"tokens": tokens.tolist(), "logits": logits.tolist(), "atol": atol, "iteration": args.iteration,
                   "padded_vocab_size": args.padded_vocab_size}, f)


if __name__ == "__main__":
    mode, out, sep, *rest = sys.argv[1:]
    assert sep == "--", __doc__
    {"save": save, "expect": expect}[mode](out, rest)
