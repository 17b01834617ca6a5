"""Runs inside a chroot with transformers (Debian unstable: python3-transformers 5.x, torch 2.x): loads
Hugging Face model folders (e.g. a ckptfs mount's hf/) the way users do and checks them against a
reference, down to the logits.

    python3 chroot_hf_logits.py MODEL_DIR [MODEL_DIR...] (--reference-dir DIR | --reference-weights FILE)
                                [--logits-check JSON] [--tolerance 1e-6]
    python3 chroot_hf_logits.py MODEL_DIR [MODEL_DIR...] --expected-logits LOGITS_JSON

For each MODEL_DIR: safe_open(MODEL_DIR/model.safetensors) holds exactly the reference's tensors, bit for
bit; AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype float32) loads with no missing, unexpected or
mismatched keys; the logits of the token batch equal the reference model's exactly (same weights, same
code: max abs diff 0); with --logits-check, logits[0, 0, :8] match its hf_logits_fp32_first_token_first8
within the tolerance.

The reference is either a model folder (--reference-dir, loaded with from_pretrained the same way) or a
weights file in Hugging Face names (--reference-weights: .safetensors, or a torch.save'd state dict), loaded
into a model made from MODEL_DIR's config. Tokens: the logits-check file's "tokens", else a fixed batch.
With --expected-logits (a generated Megatron case's expected/logits.json: "tokens", "logits" [batch, seq, vocab]
from the generator's own float64 forward pass of the unsplit Megatron model, "atol"): from_pretrained as above,
then the logits of its tokens within atol of the file's.
chroot_clients.py (beside this script) supplies the tensor comparison and the PASS/FAIL lines; exit 1 if
any check failed.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroot_clients import print_versions, run_checks, same_state, summary  # noqa: E402

# `torch_dtype` was renamed `dtype` in transformers 4.56
DTYPE_KW = "dtype" if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"


def load_weights(path):
    if path.endswith(".safetensors"):
        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def from_pretrained(folder):
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True,
                                                       **{DTYPE_KW: torch.float32})
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"from_pretrained({folder}): loading info not clean: {bad}"
    return model.eval()


def model_from_weights(config_dir, weights):
    """A model made from config_dir's config holding `weights` (cast to float32); tied weights may be absent."""
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir), **{DTYPE_KW: torch.float32})
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    loaded = {p.data_ptr() for k, p in model.state_dict().items() if k in weights}
    untied = [k for k in missing if model.state_dict()[k].data_ptr() not in loaded]
    assert not unexpected and not untied, f"reference weights: unexpected {unexpected}, missing {untied}"
    return model.eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits


def load_check(folder, state):
    """(name, fn) of the from_pretrained check; fn leaves the model in state["model"]."""
    def loads():
        state["model"] = from_pretrained(folder)
        assert type(state["model"]).__name__ in state["model"].config.architectures, type(state["model"]).__name__
        return sum(1 for _ in state["model"].state_dict())
    return f"{folder}: from_pretrained(dtype=float32)", loads


def check_expected_logits(folder, expected):
    """Checks of one MODEL_DIR against a logits.json of the Megatron fixture generator."""
    state = {}
    tokens = torch.tensor(expected["tokens"])
    want = torch.tensor(expected["logits"], dtype=torch.float64)

    def logits_match():
        assert "model" in state, "the model did not load"
        ours = logits_of(state["model"], tokens).double()
        assert ours.shape == want.shape, f"logits shape {tuple(ours.shape)}, expected {tuple(want.shape)}"
        diff = (ours - want).abs()
        worst = divmod(int(diff.argmax()), want.shape[-1])
        print(f"  {folder}: logits {tuple(ours.shape)}, max abs diff to Megatron's forward {diff.max().item():.3g} "
              f"(atol {expected['atol']:.3g}, max |logit| {want.abs().max().item():.3g}) at (row, vocab) {worst}")
        assert diff.max().item() <= expected["atol"], \
            f"logits differ from Megatron's by {diff.max().item():.3g} > {expected['atol']:.3g}"
        return ours.numel()

    return [load_check(folder, state),
            (f"{folder}: logits within {expected['atol']:.3g} of the Megatron forward pass's", logits_match)]


def check_model_dir(folder, ref, tokens, expect, tol):
    """Checks of one MODEL_DIR, as (name, fn) pairs for run_checks; fn returns a count."""
    state = {}

    def safetensors_equal():
        got = {}
        with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as f:
            for k in f.keys():
                got[k] = f.get_tensor(k)
        return same_state("model.safetensors", got, ref["weights"], False)

    def logits_equal():
        assert "model" in state, "the model did not load"
        ours = logits_of(state["model"], tokens)
        state["logits"] = ours
        want = ref["logits"]
        assert ours.shape == want.shape, f"logits shape {tuple(ours.shape)}, reference {tuple(want.shape)}"
        diff = (ours - want).abs().max().item()
        print(f"  {folder}: logits {tuple(ours.shape)}, max abs diff to the reference {diff}; "
              f"first token first 8: {ours[0, 0, :8].tolist()}")
        assert torch.equal(ours, want), f"logits differ from the reference's: max abs diff {diff}"
        return ours.numel()

    def logits_match_check_file():
        assert "logits" in state, "no logits"
        got = state["logits"][0, 0, :8].double()
        want = torch.tensor(expect, dtype=torch.float64)
        diff = (got - want).abs().max().item()
        assert diff <= tol, f"logits[0, 0, :8] {got.tolist()} vs check file {expect}: max abs diff {diff} > {tol}"
        return len(expect)

    checks = [(f"{folder}: model.safetensors equals the reference weights", safetensors_equal),
              load_check(folder, state),
              (f"{folder}: logits equal the reference model's", logits_equal)]
    if expect is not None:
        checks.append((f"{folder}: logits[0, 0, :8] match the logits-check file within {tol}",
                       logits_match_check_file))
    return checks


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dirs", nargs="+")
    ref_arg = ap.add_mutually_exclusive_group(required=True)
    ref_arg.add_argument("--reference-dir", help="a Hugging Face model folder with the expected weights")
    ref_arg.add_argument("--reference-weights", help="a .safetensors or torch.save'd state dict, HF names")
    ref_arg.add_argument("--expected-logits", help="a generated Megatron case's logits.json")
    ap.add_argument("--logits-check", help="JSON with 'tokens' and 'hf_logits_fp32_first_token_first8'")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print_versions()
    print(f"transformers {transformers.__version__}", flush=True)
    if args.expected_logits:
        with open(args.expected_logits) as f:
            expected = json.load(f)
        checks = [c for d in args.model_dirs for c in check_expected_logits(d, expected)]
        return summary(len(checks), run_checks(checks, unit="values"))

    check = json.load(open(args.logits_check)) if args.logits_check else {}
    expect = check.get("hf_logits_fp32_first_token_first8")
    if args.reference_dir:
        weights = load_weights(os.path.join(args.reference_dir, "model.safetensors"))
        ref_model = from_pretrained(args.reference_dir)
    else:
        weights = load_weights(args.reference_weights)
        ref_model = model_from_weights(args.model_dirs[0], weights)
    vocab = ref_model.config.vocab_size
    tokens = torch.tensor(check["tokens"]) if "tokens" in check else (torch.arange(64).reshape(2, 32) * 37 + 5) % vocab
    ref = {"weights": weights, "logits": logits_of(ref_model, tokens)}
    assert torch.isfinite(ref["logits"]).all(), "the reference model gives non-finite logits"

    checks = [c for d in args.model_dirs for c in check_model_dir(d, ref, tokens, expect, args.tolerance)]
    return summary(len(checks), run_checks(checks, unit="values"))


if __name__ == "__main__":
    sys.exit(main())
