"""transformers 5.12's AutoModelForCausalLM.from_pretrained of the mounted hf/ of each Megatron-LM-written case
(mount_tests/fixtures/megatron-core-gen, see mount_tests/test_megatron_core_gen.py) whose family ckptfs maps, in
the Debian unstable chroot (chroot_hf_logits.py --expected-logits): loads with no missing or unexpected keys and
gives the logits of Megatron's own GPTModel forward (world size 1, fp32, on the bf16 weights it loaded from the
save) within expected/logits.json's atol (see mount_tests/gen_megatron_core/README.md for its size).
Needs ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid} (skipped with CKPTFS_SKIP_MODERN=1).
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_megatron_core_gen import GEN_DIR, HF_ARCHITECTURES, SERVED, info  # noqa: E402
from test_megatron_hf import SCRIPTS, chroot_dir, require_sid  # noqa: E402,F401 (chroot_dir: a fixture)
from test_modern_clients import in_chroot, staged  # noqa: E402,F401 (staged: a fixture)

MAPPED = [n for n in SERVED if info(n)["family"] in HF_ARCHITECTURES]


@pytest.mark.parametrize("name", MAPPED)
def test_from_pretrained_gives_megatrons_logits(chroot_dir, staged, ckptfs_bin, name):
    root = require_sid(chroot_dir)
    logits = os.path.join(GEN_DIR, name, "expected", "logits.json")
    _, inside, mnt, mnt_inside = staged(f"megatron-core-{name}", *SCRIPTS, logits)
    with mounted(ckptfs_bin, os.path.join(GEN_DIR, name, "checkpoint"), mnt):
        proc = in_chroot(root, "python3", f"{inside}/chroot_hf_logits.py", f"{mnt_inside}/hf",
                         "--expected-logits", f"{inside}/logits.json")
    print("".join(line + "\n" for line in proc.stdout.splitlines() if "max abs diff" in line), end="")
    assert proc.returncode == 0 and "FAIL" not in proc.stdout and proc.stdout.count("PASS ") == 2, H.describe(proc)
