"""Stand-ins for the DeepSpeed classes that appear in DeepSpeed checkpoint pickles.

They are registered under DeepSpeed's real module paths (``sys.modules``) so that ``torch.save`` writes
exactly the GLOBAL opcodes real DeepSpeed writes (``deepspeed.runtime.zero.config ZeroStageEnum``,
``deepspeed.runtime.fp16.loss_scaler LossScaler`` / ``DynamicLossScaler``,
``deepspeed.utils.tensor_fragment fragment_address``) and ``torch.load(weights_only=False)`` can read
real DeepSpeed files without DeepSpeed installed.  Nothing here is DeepSpeed code.
"""
import dataclasses
import enum
import sys
import types


def _module(name):
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__dict__["__ckptfs_standin__"] = True
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, mod)
    return mod


def install():
    """Registers the stand-ins (idempotent).  Returns the namespace of classes."""
    cfg = _module("deepspeed.runtime.zero.config")
    if not hasattr(cfg, "ZeroStageEnum"):
        class ZeroStageEnum(int, enum.Enum):
            disabled = 0
            optimizer_states = 1
            gradients = 2
            weights = 3
            max_stage = 3
        ZeroStageEnum.__module__ = cfg.__name__
        ZeroStageEnum.__qualname__ = 'ZeroStageEnum'
        cfg.ZeroStageEnum = ZeroStageEnum

    ls = _module("deepspeed.runtime.fp16.loss_scaler")
    if not hasattr(ls, "LossScaler"):
        class LossScalerBase:
            def __init__(self, cur_scale):
                self.cur_scale = cur_scale
                self.dynamic = False

        class LossScaler(LossScalerBase):
            pass

        class DynamicLossScaler(LossScalerBase):
            def __init__(self, init_scale=2.0 ** 8, scale_factor=2.0, scale_window=100, min_scale=1,
                         delayed_shift=2, consecutive_hysteresis=False, raise_error_at_min_scale=True,
                         dtype=None, cur_iter=3):
                super().__init__(init_scale)
                self.cur_iter = cur_iter
                self.last_overflow_iter = -1
                self.scale_factor = scale_factor
                self.scale_window = scale_window
                self.min_scale = min_scale
                self.delayed_shift = delayed_shift
                self.cur_hysteresis = delayed_shift
                self.consecutive_hysteresis = consecutive_hysteresis
                self.raise_error_at_min_scale = raise_error_at_min_scale
                self.dynamic = True
                self.dtype = dtype

        for c in (LossScalerBase, LossScaler, DynamicLossScaler):
            c.__module__ = ls.__name__
            c.__qualname__ = c.__name__
        ls.LossScalerBase, ls.LossScaler, ls.DynamicLossScaler = LossScalerBase, LossScaler, DynamicLossScaler

    tf = _module("deepspeed.utils.tensor_fragment")
    if not hasattr(tf, "fragment_address"):
        @dataclasses.dataclass
        class fragment_address:  # noqa: N801 (DeepSpeed's name)
            numel: int
            start: int
        fragment_address.__module__ = tf.__name__
        fragment_address.__qualname__ = 'fragment_address'
        tf.fragment_address = fragment_address
    # BF16 checkpoints of DeepSpeed <= 0.7 name the class here.
    bf = _module("deepspeed.runtime.bf16_optimizer")
    if not hasattr(bf, "fragment_address"):
        bf.fragment_address = tf.fragment_address
    # universal checkpoints
    uc = _module("deepspeed.checkpoint.universal_checkpoint")
    if not hasattr(uc, "SubparamShape"):
        @dataclasses.dataclass
        class SubparamShape:
            patterns: list
            shape: tuple
            partition_dim: int
        SubparamShape.__module__ = uc.__name__
        SubparamShape.__qualname__ = 'SubparamShape'
        uc.SubparamShape = SubparamShape
    return types.SimpleNamespace(ZeroStageEnum=cfg.ZeroStageEnum, LossScaler=ls.LossScaler,
                                 DynamicLossScaler=ls.DynamicLossScaler,
                                 fragment_address=tf.fragment_address)
