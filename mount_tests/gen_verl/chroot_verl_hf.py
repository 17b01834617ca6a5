"""Runs inside the Debian unstable chroot (transformers 5, torch 2.14): Hugging Face loads a mounted verl
checkpoint with from_pretrained(MNT) and gets the generator's weights.

    python3 chroot_verl_hf.py MNT EXPECTED_ACTOR_DIR [EXPECTED_CRITIC_DIR]

The actor at MNT (AutoModelForCausalLM), the critic at MNT/critic (AutoModelForTokenClassification): no
missing or unexpected keys, the dtype config.json names (bfloat16, as verl's merger writes it), every tensor
equal to the expected model.pt, and the logits of a token batch equal to those of the same architecture
built from model.pt itself.  One PASS/FAIL line per check; exits 1 if any failed.
"""
import os
import sys

import torch
import transformers as tf

from chroot_clients import run_checks, same_state, summary


def check(auto_class, mnt, exp_dir):
    expected = torch.load(os.path.join(exp_dir, "model.pt"), map_location="cpu", weights_only=True)
    model, info = auto_class.from_pretrained(mnt, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"from_pretrained({mnt}): {problems}"
    assert model.dtype == torch.bfloat16, f"from_pretrained({mnt}): dtype {model.dtype}"
    n = same_state(f"from_pretrained({mnt})", model.state_dict(), expected, False)
    ref = auto_class.from_config(tf.AutoConfig.from_pretrained(mnt), dtype=torch.bfloat16)
    ref.load_state_dict(expected, strict=True)
    ref.eval()  # as from_pretrained leaves a model: no dropout
    ids = torch.arange(12).reshape(2, 6) % model.config.vocab_size
    with torch.no_grad():
        ours, theirs = model(input_ids=ids).logits, ref(input_ids=ids).logits
    assert torch.equal(ours, theirs), f"logits differ: max abs diff {(ours - theirs).abs().max().item()}"
    return n


def main(argv):
    mnt, actor = argv[1], argv[2]
    checks = [("from_pretrained actor", lambda: check(tf.AutoModelForCausalLM, mnt, actor))]
    if len(argv) > 3:
        critic = argv[3]
        checks.append(("from_pretrained critic",
                       lambda: check(tf.AutoModelForTokenClassification, os.path.join(mnt, "critic"), critic)))
    print(f"transformers {tf.__version__}, torch {torch.__version__}")
    return summary(len(checks), run_checks(checks))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
