"""The fixture generator's expectations against an independent second implementation: helpers.
reference_merge re-derives the merged fp32 and model weights from the generated shard files alone (in
the spirit of zero_to_fp32, with ckptfs's documented differences). Two programs written separately
agree, so an expectation is not a copy of the generator's own bookkeeping. ckptfs is not involved."""
import os

import pytest

import helpers as H
from conftest import case_info
from gen.generate import make_cases

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
