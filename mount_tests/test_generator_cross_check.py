"""The fixture generator's expectations against an independent second implementation: helpers.
reference_merge re-derives the merged fp32 and model weights from the generated shard files alone (in
the spirit of zero_to_fp32, with ckptfs's documented differences). Two programs written separately
agree, so an expectation is not a copy of the generator's own bookkeeping. ckptfs is not involved.
The Megatron generator's distributed-optimizer buffer layout against small layouts worked out by hand from
Megatron-LM's rules (the sources cited in gen_megatron/megatron_layout.py grad_buffer_layout)."""
import os
import sys

import numpy as np
import pytest

import helpers as H
from conftest import case_info
from gen.generate import make_cases

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen_megatron"))
import megatron_layout as ML  # noqa: E402

CASES = [c["name"] for c in make_cases()]


@pytest.mark.parametrize("name", CASES)
def test_reference_merge_equals_generator_expectations(fixtures_dir, name):
    info = case_info(fixtures_dir, name)
    src = os.path.join(fixtures_dir, name, "checkpoint")
    for tag in info["tags"]:
        exp_dir = os.path.join(fixtures_dir, name, info["expected"][tag])
        fp32, model = H.reference_merge(src, tag)
        H.assert_state_equal(fp32, H.load_expected(os.path.join(exp_dir, "fp32.pt")), ordered=True,
                             what=f"{name}/{tag} fp32")
        H.assert_state_equal(model, H.load_expected(os.path.join(exp_dir, "model.pt")), ordered=False,
                             what=f"{name}/{tag} model")


# (numels, shared_embedding flags, DP, bucket_size, aligned) -> (param ranges, bucket ranges, unpadded sizes),
# by hand: params walk in reverse; aligned: starts up to a multiple of 64, bucket ends up to lcm(DP, 128);
# unaligned (core <= 0.6): bucket ends up to a multiple of DP.
HAND_LAYOUTS = [
    # bucket 0 = the last two params (70 + 30 >= 90 elements, the 30 starting at 128), then the first
    (([100, 30, 70], [False] * 3, 2, 90, True),
     ([(256, 356, 1), (128, 158, 0), (0, 70, 0)], [(0, 256), (256, 384)], [158, 100])),
    # a shared embedding (first param) closes the open bucket at its own aligned start, then its own bucket
    (([10, 100, 70], [True, False, False], 4, None, True),
     ([(256, 266, 1), (128, 228, 0), (0, 70, 0)], [(0, 256), (256, 384)], [256, 10])),
    # core 0.6: no start padding, bucket ends padded to a multiple of DP 3
    (([5, 7], [False, False], 3, 6, False), ([(9, 14, 1), (0, 7, 0)], [(0, 9), (9, 15)], [7, 5])),
]


@pytest.mark.parametrize("args,want", HAND_LAYOUTS)
def test_megatron_grad_buffer_layout_follows_megatrons_rules(args, want):
    assert ML.grad_buffer_layout(*args) == want


def test_megatron_saved_buffer_strips_the_bucket_end_padding():
    """distrib_optim.pt's compact tensor: bucket 1 starts right after bucket 0's 158 unpadded elements, so the
    first param (at 256 in the grad buffer, bucket 1's start) lands at 158; gaps keep the fill."""
    arrays = [np.arange(n, dtype=np.float32) + 1 for n in (100, 30, 70)]
    out, offsets, total, unpadded = ML.pack_buffer([(a, False) for a in arrays], lambda n: np.zeros(n, np.float32),
                                                   2, bucket_size=90)
    assert (offsets, total, unpadded) == ([158, 128, 0], 258, [158, 100])
    for a, off in zip(arrays, offsets):
        assert (out[off:off + a.size] == a).all()
    assert not out[70:128].any()
