"""Hugging Face transformers loads the hf/ view of a mounted real Megatron-LM checkpoint
(mount_tests/fixtures/megatron-real) and computes the same logits as the reference export
legacy_tp2_pp2/expected/hf_llama: AutoModelForCausalLM.from_pretrained(MNT/hf, float32) in a Debian unstable
chroot (python3-transformers 5.x, torch 2.x), the token batch of expected/hf_llama/logits_check.json through
both models, logits equal (max abs diff 0: the weights are the same bytes) and within 1e-6 of the check
file's; see chroot_hf_logits.py.  Both checkpoints (torch and torch_dist formats) hold the same weights, so
the one reference serves both; the mount root's hf/ and tags/iter_0000003/hf/ are checked.

Generated cases (mount_tests/gen_megatron, cached like test_megatron.py's): the mounted hf/ of a Llama bf16
TP2xPP2, a Qwen2-style (q/k/v biases, TP4, tied), GPT-2-style fp16 (fused bias-GeLU), legacy-naming GPT-2
(openai_gelu), fp32 GPT-2 (erf GeLU), a torch_dist GPT-2 case, Mixtral-style MoE (SequentialMLP at EP2 x PP2,
TEGroupedMLP at EP2 x TP2: MixtralForCausalLM) and Qwen3-MoE-style MoE (q/k norms, a dense first layer,
pre-softmax router, EP2 x TP2: Qwen3MoeForCausalLM) and Qwen2-MoE-style MoE (q/k/v biases, a gated shared
expert, a dense layer, EP2 x TP2: Qwen2MoeForCausalLM) loads with from_pretrained(float32) with no
missing or unexpected keys and gives, on the case's tokens, the logits of expected/logits.json: the generator's
float64 numpy forward pass of the unsplit Megatron model written from Megatron's definitions (weights as stored
in the training dtype), within its atol (5e-6 of the largest logit: float32 rounding).

The chroot: ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}, made by
`CKPTFS_CHROOT=/var/cache/ckptfs/sid CKPTFS_CHROOT_SUITE=sid bash mount_tests/modern/setup_chroot.sh`.  If it
is missing these tests fail saying so, unless CKPTFS_SKIP_MODERN=1 (then they are skipped).  Mounts live
under CHROOT/mnt/ so the chroot sees them; ckptfs runs on the host.
"""
import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_modern_clients import chroot_versions, in_chroot, staged  # noqa: E402,F401 (staged: a fixture)
from test_megatron import info_of, megatron_fixtures, source_of  # noqa: E402,F401 (megatron_fixtures: a fixture)
from test_real_megatron import CASES, HF_REF, TAG, case_path  # noqa: E402

SID = os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))
SCRIPTS = [os.path.join(HERE, "chroot_hf_logits.py"), os.path.join(HERE, "chroot_clients.py")]


@pytest.fixture(scope="session")
def chroot_dir():
    """The sid chroot (this module's `staged` stages there): (root, versions or None)."""
    if os.environ.get("CKPTFS_SKIP_MODERN") == "1":
        pytest.skip("CKPTFS_SKIP_MODERN=1")
    return SID, chroot_versions(SID)


def require_sid(chroot):
    root, versions = chroot
    if versions is None:
        pytest.fail(f"the Debian unstable chroot with transformers is not set up ({root}/.ckptfs-chroot-complete "
                    f"missing): run `CKPTFS_CHROOT={root} CKPTFS_CHROOT_SUITE=sid bash "
                    f"mount_tests/modern/setup_chroot.sh` or point CKPTFS_SID_CHROOT at one (or set "
                    f"CKPTFS_SKIP_MODERN=1 to skip these tests)", pytrace=False)
    if versions.get("transformers", "absent") == "absent":
        pytest.fail(f"{root} has no transformers (stamp: {versions}); it must be a CKPTFS_CHROOT_SUITE=sid chroot",
                    pytrace=False)
    return root


def stage_reference(staged, name):
    """(chroot-side folder with the scripts, the reference model folder inside it, host mount point, the
    mount point inside the chroot)."""
    host, inside, mnt, mnt_inside = staged(name, *SCRIPTS)
    shutil.copytree(HF_REF, os.path.join(host, "ref"))
    return inside, f"{inside}/ref", mnt, mnt_inside


def run_logits(root, inside, ref, model_dirs):
    proc = in_chroot(root, "python3", f"{inside}/chroot_hf_logits.py", *model_dirs, "--reference-dir", ref,
                     "--logits-check", f"{ref}/logits_check.json")
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, H.describe(proc)
    assert proc.stdout.count("PASS ") == 4 * len(model_dirs), H.describe(proc)
    return proc


def test_logits_harness_on_the_reference(chroot_dir, staged):
    """The reference folder against itself: proves the harness (transformers loads it, its logits match the
    check file Megatron's forward pass was compared with)."""
    root = require_sid(chroot_dir)
    inside, ref, _, _ = stage_reference(staged, "megatron-hf-ref")
    run_logits(root, inside, ref, [ref])


@pytest.mark.parametrize("name", CASES)
def test_from_pretrained_of_the_mounted_hf(chroot_dir, staged, ckptfs_bin, name):
    root = require_sid(chroot_dir)
    inside, ref, mnt, mnt_inside = stage_reference(staged, f"megatron-hf-{name}")
    with mounted(ckptfs_bin, case_path(name, "checkpoint"), mnt):
        run_logits(root, inside, ref, [f"{mnt_inside}/hf", f"{mnt_inside}/tags/{TAG}/hf"])


GENERATED = ["llama_tp2_pp2_dp4", "te_qkvbias_tp4_tied", "gpt_fp16_tp2_pp2_tied", "legacy_gpt_tp4_pp2_tied",
             "fp32_tp2_pp2_gelu", "dist_gpt_tp4_te", "moe_seq_ep2_tp1_pp2", "moe_grouped_ep2_tp2_te",
             "qwen3moe_mixed_ep2_tp2_te", "qwen2moe_shared_ep2_tp2"]


@pytest.mark.parametrize("name", GENERATED)
def test_generated_case_logits_match_megatron(chroot_dir, staged, ckptfs_bin, megatron_fixtures, name):
    root = require_sid(chroot_dir)
    info = info_of(megatron_fixtures, name)
    logits = os.path.join(megatron_fixtures, name, info["expected"][info["latest"]], "logits.json")
    _, inside, mnt, mnt_inside = staged(f"megatron-gen-{name}", *SCRIPTS, logits)
    with mounted(ckptfs_bin, source_of(megatron_fixtures, name), mnt):
        proc = in_chroot(root, "python3", f"{inside}/chroot_hf_logits.py", f"{mnt_inside}/hf",
                         "--expected-logits", f"{inside}/logits.json")
    print("".join(line + "\n" for line in proc.stdout.splitlines() if "max abs diff" in line), end="")
    assert proc.returncode == 0 and "FAIL" not in proc.stdout and proc.stdout.count("PASS ") == 2, H.describe(proc)
