#!/usr/bin/env python3
"""transformers loads a mount whose names had a wrapper's prefix, in the dtype its config.json names, and holds
the generator's tensors: runs in the Debian unstable chroot beside a copy of mount_tests/device/check_hf_load.py
(whose same_state compares).

    python3 chroot_from_pretrained.py MNT EXPECTED_MODEL_PT

AutoModelForCausalLM.from_pretrained(MNT, dtype="auto", output_loading_info=True): no missing, unexpected or
mismatched key, the class config.json names, every tensor of its state_dict() bit for bit (dtype included) the
expected one (a tied lm_head.weight is the embedding's tensor, as expected), one forward pass with finite
logits.  Prints PASS lines; exit 0 only if all hold.
"""
import sys

from check_hf_load import same_state  # noqa: E402 (sets HF_HUB_OFFLINE, imports torch)
import torch  # noqa: E402


def main(mnt, expected_pt):
    import transformers
    exp = torch.load(expected_pt, map_location="cpu", weights_only=True)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(mnt, dtype="auto", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"loading info not clean: {bad}"
    name = type(model).__name__
    assert [name] == model.config.architectures, f"{name}, config.json names {model.config.architectures}"
    print(f"PASS from_pretrained: {name}, dtype {model.dtype}, transformers {transformers.__version__}", flush=True)
    print(f"PASS state_dict: {same_state('state_dict', model.state_dict(), exp)}", flush=True)
    ids = (torch.arange(16).reshape(2, 8) * 5 + 3) % model.config.vocab_size
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits
    assert torch.isfinite(logits.float()).all(), "non-finite logits"
    print(f"PASS forward: logits {tuple(logits.shape)}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
