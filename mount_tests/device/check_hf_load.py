#!/usr/bin/env python3
"""Loads a ckptfs mount of the Llama-shaped case (mount_tests/gen/generate.py, llama_z3_bf16_dp2) the way
users do and compares every tensor bit for bit with the generator's expectation.

    python3 check_hf_load.py MNT EXPECTED_MODEL_PT [--safetensors-only] [--device auto|cpu|cuda]

Checks: config.json is a Llama config; safetensors.safe_open(MNT/model.safetensors) gives every tensor of
expected/model.pt; transformers.AutoModelForCausalLM.from_pretrained(MNT, torch_dtype=torch.bfloat16)
(`dtype=` on transformers >= 4.56)
loads with no missing/unexpected keys and its state_dict equals expected/model.pt; one forward pass gives
finite logits (on CUDA too when there is a GPU).  --safetensors-only skips the transformers checks (for
machines without transformers).  Prints PASS/FAIL per check and a final `RESULT: PASS|FAIL` line; exit 0
only if every check passed.
"""
import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

RESULTS = []


def check(name):
    def wrap(fn):
        t0 = time.monotonic()
        try:
            detail = fn()
            RESULTS.append((name, True))
            print(f"PASS {name}" + (f": {detail}" if detail else "") + f" ({time.monotonic() - t0:.2f}s)", flush=True)
        except Exception as e:  # noqa: BLE001 (every check reports)
            RESULTS.append((name, False))
            msg = str(e) if isinstance(e, AssertionError) else traceback.format_exc(limit=4)
            print(f"FAIL {name}: {msg}", flush=True)
        return fn
    return wrap


def as_bytes(t):
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def same_tensor(what, ours, exp):
    assert ours.dtype == exp.dtype, f"{what}: dtype {ours.dtype}, expected {exp.dtype}"
    assert tuple(ours.shape) == tuple(exp.shape), f"{what}: shape {tuple(ours.shape)}, expected {tuple(exp.shape)}"
    a, b = as_bytes(ours), as_bytes(exp)
    if not torch.equal(a, b):
        n = int((a != b).sum())
        raise AssertionError(f"{what}: {n} of {a.numel()} bytes differ")


def same_state(what, ours, exp):
    missing = [k for k in exp if k not in ours]
    extra = [k for k in ours if k not in exp]
    assert not missing and not extra, f"{what}: missing {missing}, unexpected {extra}"
    for k in exp:
        same_tensor(f"{what}: {k}", ours[k], exp[k])
    return f"{len(exp)} tensors bit-identical"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mnt")
    ap.add_argument("expected_model_pt")
    ap.add_argument("--safetensors-only", action="store_true", help="skip the transformers checks")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args(argv)
    mnt = args.mnt
    exp = torch.load(args.expected_model_pt, map_location="cpu", weights_only=True)
    print(f"check_hf_load: mount {mnt}; expected {len(exp)} tensors; torch {torch.__version__}; "
          f"cuda {'yes: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no'}", flush=True)

    @check("config.json is a Llama config")
    def _():
        with open(os.path.join(mnt, "config.json")) as f:
            cfg = json.load(f)
        assert cfg.get("model_type") == "llama", f"model_type {cfg.get('model_type')!r}"
        assert cfg.get("architectures") == ["LlamaForCausalLM"], cfg.get("architectures")
        return f"hidden {cfg['hidden_size']}, layers {cfg['num_hidden_layers']}, vocab {cfg['vocab_size']}"

    @check("safetensors safe_open model.safetensors")
    def _():
        import safetensors
        from safetensors import safe_open
        got = {}
        with safe_open(os.path.join(mnt, "model.safetensors"), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}, f"metadata {f.metadata()!r}"
            for k in f.keys():
                got[k] = f.get_tensor(k)
        return same_state("safe_open", got, exp) + f" (safetensors {safetensors.__version__})"

    if args.safetensors_only:
        print("SKIP transformers checks (--safetensors-only)", flush=True)
    else:
        state = {}

        @check("transformers from_pretrained(bfloat16)")
        def _():
            import transformers
            from transformers import AutoModelForCausalLM
            # `torch_dtype` is deprecated in favour of `dtype` since transformers 4.56
            major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
            kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
            model, info = AutoModelForCausalLM.from_pretrained(mnt, **{kw: torch.bfloat16},
                                                               output_loading_info=True)
            state["model"] = model.eval()
            bad = {k: v for k, v in info.items() if v}
            assert not bad, f"loading info not clean: {bad}"
            assert type(model).__name__ == "LlamaForCausalLM", type(model).__name__
            return f"{type(model).__name__}, transformers {transformers.__version__}"

        @check("transformers state_dict equals expected/model.pt")
        def _():
            assert "model" in state, "model did not load"
            return same_state("state_dict", state["model"].state_dict(), exp)

        devices = ["cpu"]
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
            devices.append("cuda")
        for dev in devices:
            @check(f"forward pass on {dev}")
            def _():
                assert "model" in state, "model did not load"
                model = state["model"].to(dev)
                vocab = model.config.vocab_size
                ids = (torch.arange(24, device=dev).reshape(2, 12) * 7 + 3) % vocab
                with torch.no_grad():
                    logits = model(input_ids=ids).logits
                assert tuple(logits.shape) == (2, 12, vocab), tuple(logits.shape)
                assert torch.isfinite(logits.float()).all(), "non-finite logits"
                nxt = logits[:, -1].float().argmax(-1).tolist()
                return f"logits {tuple(logits.shape)} {logits.dtype}, mean {logits.float().mean():.4f}, next tokens {nxt}"

    failed = [n for n, ok in RESULTS if not ok]
    print(f"RESULT: {'FAIL' if failed else 'PASS'} ({len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + ")", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
