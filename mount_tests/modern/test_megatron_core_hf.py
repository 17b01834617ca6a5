"""transformers 5.12's AutoModelForCausalLM.from_pretrained of the mounted hf/ of each Megatron-LM-written case
(mount_tests/fixtures/megatron-core-gen, see mount_tests/test_megatron_core_gen.py) whose family ckptfs maps, in
the Debian unstable chroot (chroot_hf_logits.py's --expected-logits checks, all cases in one process:
chroot_hf_logits_each.py): loads with no missing or unexpected keys and gives the logits of Megatron's own GPTModel
forward (world size 1, fp32, on the bf16 weights it loaded from the save) within expected/logits.json's atol (see
mount_tests/gen_megatron_core/README.md for its size).
Needs ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid} (skipped with CKPTFS_SKIP_MODERN=1).
"""
import contextlib
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402
from mounting import mounted  # noqa: E402
from test_megatron_core_gen import GEN_DIR, HF_ARCHITECTURES, SERVED, info  # noqa: E402
from test_megatron_hf import SCRIPTS, chroot_dir, require_sid  # noqa: E402,F401 (chroot_dir: a fixture)
from test_modern_clients import in_chroot, staged  # noqa: E402,F401 (staged: a fixture)

MAPPED = [n for n in SERVED if info(n)["family"] in HF_ARCHITECTURES]


def test_from_pretrained_gives_megatrons_logits(chroot_dir, staged, ckptfs_bin):
    """Every mapped case mounted at once and checked by one chroot process (chroot_hf_logits_each.py)."""
    root = require_sid(chroot_dir)
    assert MAPPED, "no case with a Hugging Face family"
    host, inside, _, _ = staged("megatron-core-hf", *SCRIPTS, os.path.join(HERE, "chroot_hf_logits_each.py"))
    pairs = []
    with contextlib.ExitStack() as stack:
        for name in MAPPED:
            shutil.copy(os.path.join(GEN_DIR, name, "expected", "logits.json"), os.path.join(host, f"{name}.json"))
            _, _, mnt, mnt_inside = staged(f"megatron-core-{name}")
            stack.enter_context(mounted(ckptfs_bin, os.path.join(GEN_DIR, name, "checkpoint"), mnt))
            pairs += [f"{mnt_inside}/hf", f"{inside}/{name}.json"]
        proc = in_chroot(root, "python3", f"{inside}/chroot_hf_logits_each.py", *pairs)
    print("".join(line + "\n" for line in proc.stdout.splitlines() if "max abs diff" in line), end="")
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, H.describe(proc)
    assert proc.stdout.count("PASS ") == 2 * len(MAPPED), H.describe(proc)
