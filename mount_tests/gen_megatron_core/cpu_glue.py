"""The little glue megatron-core 0.20 (Megatron-LM 2a75ac12c5) needs to run on a CPU-only machine with gloo.
Imported before anything of Megatron's; each patch says which Megatron line needs it.

- Megatron's Triton kernel modules (moe/ops/paged_stash.py, ssm/ops/*.py) import triton unconditionally, and
  megatron.training imports them through the paged stash and the Mamba layer specs (Debian packages no Triton).
  Those kernels are GPU features a GPT model on CPU never runs, so these modules alone are replaced by names that
  fail if ever called.  A stand-in `triton` package would not do: torch itself then believes Triton is installed.
- arguments.py's --rl-persist-cuda-graphs passes type=bool to argparse.BooleanOptionalAction, which Python
  3.14 (Debian unstable's) refuses; the keyword is dropped (the action ignores it on older Pythons too).
- torch.cuda.current_device() (MoEAuxLossAutoScaler's scale in initialize.py, the MoE router's and
  token dispatcher's buffers, checkpointing.py's all-reduce of the iteration) is answered with "cpu", so those
  tensors are made on the CPU, where gloo reduces them.
- torch.cuda.get_device_properties/get_device_capability (validate_args' get_device_arch_version, which picks
  performance warnings and defaults for TP > 1) answer Hopper, 9.0.
- torch.cuda.synchronize (Timers), torch.cuda.Stream / current_stream / stream (get_model's DDP wrapping
  stream) do nothing, and Module.cuda() (get_model's "GPU allocation") leaves the module where it is.
- Tensors Megatron makes with device="cuda" (the optimizer's _scale_one, grad norms, found_inf ...) or moves with
  .cuda() / .to("cuda") are made and kept on the CPU: a torch function mode, entered for the whole process, rewrites
  a CUDA device argument to the CPU; and Tensor.type() names CPU tensors as the CUDA ones they stand for
  (Float16OptimizerWithFloat16Params takes only 'torch.cuda.BFloat16Tensor' ... parameters).
- CudaRNGStatesTracker.fork (entered around attention's dropout, tensor_parallel/random.py) keeps the CPU
  generator: there is no CUDA generator to fork, and the cases use no dropout (Qwen3's and Mixtral's is 0).
- TORCHDYNAMO_DISABLE=1: Megatron's jit_fuser (torch.compile) functions (SwiGLU, rope ...) run eagerly; inductor
  would compile C++ for them and ask the (absent) GPU for its properties.
- torch.distributed.all_gather_into_tensor of bf16 tensors (the distributed optimizer's param all-gather,
  param_and_grad_buffer.py's dist_all_gather_func, bound at import) gathers the same bytes viewed as uint8: gloo's
  all-gather takes no 16-bit type ("RuntimeError: Invalid scalar type" in start_param_sync), and a gather copies
  bits.
- torch.cuda.get_rng_state() (checkpointing.get_rng_state) is the CPU generator's state, so the saved
  rng_state has Megatron's own shape (a ByteTensor) with CPU bytes in it.
"""
import argparse
import contextlib
import os
import sys
import types

os.environ["TORCHDYNAMO_DISABLE"] = "1"

import torch
from torch.overrides import TorchFunctionMode


TRITON_MODULES = ["megatron.core.transformer.moe.ops.paged_stash"] + [
    f"megatron.core.ssm.ops.{m}" for m in ("ssd_bmm", "ssd_chunk_scan", "ssd_combined", "ssd_state_passing",
                                           "causal_conv1d_varlen", "ssd_chunk_state", "batch_invariant_decode")]


class _KernelModule(types.ModuleType):
    """Every name a function that raises: the kernels are imported, never called."""
    GLOBAL_BLOCK_SIZE = 1024  # paged_stash.py's constant, imported with its kernels

    def __getattr__(self, name):
        if name.startswith("__"):  # __file__, __path__ ...: a module without them, as inspect expects
            raise AttributeError(name)

        def no_kernel(*_, **__):
            raise RuntimeError(f"{self.__name__}.{name}: Triton kernels do not run in the CPU fixture generator")
        return no_kernel


for _name in TRITON_MODULES:
    sys.modules[_name] = _KernelModule(_name)

torch.cuda.current_device = lambda: "cpu"
torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(major=9, minor=0, name="cpu")
torch.cuda.get_device_capability = lambda device=None: (9, 0)
torch.cuda.synchronize = lambda device=None: None


class _NoStream:
    def wait_stream(self, _):
        pass

    def synchronize(self):
        pass


_all_gather_into_tensor = torch.distributed.all_gather_into_tensor


def _all_gather_bits(output, input, group=None, async_op=False):  # noqa: A002 (torch's parameter name)
    if output.dtype == torch.bfloat16:
        output, input = output.view(torch.uint8), input.view(torch.uint8)
    return _all_gather_into_tensor(output, input, group=group, async_op=async_op)


torch.distributed.all_gather_into_tensor = _all_gather_bits
torch.cuda.Stream = lambda *_, **__: _NoStream()
torch.cuda.current_stream = lambda device=None: _NoStream()
torch.cuda.stream = lambda _: contextlib.nullcontext()
torch.nn.Module.cuda = lambda self, device=None: self
torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **_: self


def _is_cuda(device):
    return (isinstance(device, str) and device.startswith("cuda")) or \
        (isinstance(device, torch.device) and device.type == "cuda") or \
        (isinstance(device, int) and not isinstance(device, bool))


class _CudaIsCpu(TorchFunctionMode):
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        result = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and result.startswith("torch."):
            return "torch.cuda." + result[len("torch."):]
        return result


_CudaIsCpu().__enter__()


class _BooleanOptionalAction(argparse.BooleanOptionalAction):
    def __init__(self, *args, type=None, **kwargs):  # noqa: A002 (argparse's keyword)
        super().__init__(*args, **kwargs)


argparse.BooleanOptionalAction = _BooleanOptionalAction


def _fork_nothing(self, name=None):
    return contextlib.nullcontext()


def patch_rng_tracker():
    """Called once megatron.core is importable (it imports this module's patched torch first)."""
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    CudaRNGStatesTracker.fork = _fork_nothing
