"""Issue 32's silent error: a torch_dist MoE save with the distributed optimizer (dp_reshardable) holds its
ChainedOptimizer's state under chained_0. / chained_1. keys, which ckptfs served in model.safetensors as weights.

The real Megatron-LM 2a75ac12c5 case mount_tests/fixtures/megatron-2026-real/shared_torch_dist_qwen3moe_ep2 is
rewritten in the Debian unstable chroot by torch 2.14's own DCP reader and writer (chroot_chained_optimizer.py):
its model and run-state items kept byte for byte, its optimizer state replaced by chained distributed-optimizer
keys.  The mount's model.safetensors must still be Megatron's own TP=1 load (expected/manifest.json,
expected/full_model.pt), with no fp32/ and a note saying why.

The mounted hf/ of every real case (Qwen3-MoE torch_dist, Bridge's Qwen3 and Qwen3-MoE) loads with
from_pretrained there and gives the golden model's logits.  Needs ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}
(skipped with CKPTFS_SKIP_MODERN=1, like the other tests here).
"""
import json
import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_megatron_hf import SCRIPTS, chroot_dir, require_sid, run_logits  # noqa: E402,F401 (chroot_dir: a fixture)
from test_modern_clients import in_chroot, staged  # noqa: E402,F401 (staged: a fixture)
from test_real_megatron import check_model  # noqa: E402
from test_real_megatron_2026 import CASES, REAL_DIR, TAG, TORCH_DIST_MOE  # noqa: E402


def test_chained_distributed_optimizer_state_is_not_served_as_weights(chroot_dir, staged, ckptfs_bin):
    root = require_sid(chroot_dir)
    host, inside, mnt, _ = staged("chained", os.path.join(HERE, "chroot_chained_optimizer.py"))
    shutil.copytree(os.path.join(REAL_DIR, TORCH_DIST_MOE, "checkpoint", TAG), os.path.join(host, "src"))
    proc = in_chroot(root, "python3", f"{inside}/chroot_chained_optimizer.py", f"{inside}/src",
                     f"{inside}/save/{TAG}")
    assert proc.returncode == 0, H.describe(proc)
    save = os.path.join(host, "save")
    shutil.copy(os.path.join(REAL_DIR, TORCH_DIST_MOE, "checkpoint", "latest_checkpointed_iteration.txt"), save)
    with mounted(ckptfs_bin, save, mnt) as m:
        model = check_model(m, TORCH_DIST_MOE, "chained optimizer save: mount", real_dir=REAL_DIR)
        assert not [k for k in model if k.startswith("chained_")]
        assert not os.path.exists(os.path.join(m, "fp32")), sorted(os.listdir(m))
        with open(os.path.join(m, "ckptfs.json")) as f:
            notes = json.load(f)["tags"][0]["notes"]
    assert any("chained optimizer" in n and "fp32" in n for n in notes), notes


@pytest.mark.parametrize("name", CASES)
def test_from_pretrained_of_the_mounted_hf(chroot_dir, staged, ckptfs_bin, name):
    """AutoModelForCausalLM.from_pretrained(MNT/hf) of each real case (Qwen3, Qwen3-MoE: transformers 5.12 fuses
    the per-expert tensors as it loads) gives the golden model's logits exactly, and within 1e-6 those its
    logits_check.json records."""
    root = require_sid(chroot_dir)
    host, inside, mnt, mnt_inside = staged(f"megatron-2026-{name}", *SCRIPTS)
    shutil.copytree(os.path.join(REAL_DIR, name, "expected", "hf_llama"), os.path.join(host, "ref"))
    with mounted(ckptfs_bin, os.path.join(REAL_DIR, name, "checkpoint"), mnt):
        run_logits(root, inside, f"{inside}/ref", [f"{mnt_inside}/hf", f"{mnt_inside}/tags/{CASES[name][0]}/hf"])
