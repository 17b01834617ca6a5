"""Modern clients read ckptfs mounts: a Debian 13 (trixie) chroot with torch 2.x and the reference
(Rust-backed) safetensors library reads the views of a few generated cases — the two .safetensors views
byte for byte against what safetensors.torch.save_file writes for the expected tensors, safe_open (every tensor and
get_slice), safetensors.torch.load_file, torch.load(weights_only=True) with mmap=True and mmap=False —
and compares every tensor bit for bit with the case's expectations; the Llama case's check_hf_load.py
(mount_tests/device/) runs there too.

The chroot is made by `bash mount_tests/modern/setup_chroot.sh` (at ${CKPTFS_CHROOT:-build/trixie}).  If it
is missing these tests fail, unless CKPTFS_SKIP_MODERN=1 (then they are skipped).  The mounts live under
CHROOT/mnt/ so that the chroot sees them; ckptfs itself runs on the host.
"""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)
import helpers as H  # noqa: E402
from conftest import case_info  # noqa: E402
from mounting import mounted  # noqa: E402

CHROOT = os.environ.get("CKPTFS_CHROOT", "build/trixie")
CHROOT = os.path.abspath(CHROOT if os.path.isabs(CHROOT) else os.path.join(H.REPO, CHROOT))
STAMP = os.path.join(CHROOT, ".ckptfs-chroot-complete")
CLIENT_TIMEOUT = 300  # one chroot python: imports torch, reads every view of a small case
CASES = ["z3_bf16_dp4", "z2_fp16_dp2", "z1_bf16_dp8", "z0_fp32_dp2", "pp2_z1_fp16_dp2", "llama_z3_bf16_dp2",
         "z0_bf16_unfused_dp2", "pp2_bf16opt_z0_dp1"]
LLAMA = "llama_z3_bf16_dp2"


@pytest.fixture(scope="session")
def chroot_dir():
    """(chroot root, {package: version} from its stamp); skips with CKPTFS_SKIP_MODERN=1 and fails (in the
    test, so that it reports FAILED, not ERROR) when the chroot is not set up."""
    if os.environ.get("CKPTFS_SKIP_MODERN") == "1":
        pytest.skip("CKPTFS_SKIP_MODERN=1")
    return CHROOT, chroot_versions(CHROOT)


def chroot_versions(root):
    """{package: version} from the stamp setup_chroot.sh leaves in a complete chroot; None without one."""
    stamp = os.path.join(root, ".ckptfs-chroot-complete")
    if not os.path.isfile(stamp):
        return None
    with open(stamp) as f:
        return dict(line.split(" ", 1) for line in f.read().splitlines() if " " in line)


def require(chroot):
    root, versions = chroot
    if versions is None:
        pytest.fail(f"the Debian 13 client chroot is not set up ({STAMP} missing): run "
                    f"`bash mount_tests/modern/setup_chroot.sh` (or set CKPTFS_SKIP_MODERN=1 to skip these tests)",
                    pytrace=False)
    return root, versions


@pytest.fixture
def staged(chroot_dir, tmp_path):
    """stage(name, *files) -> chroot-side folder holding copies of `files` (scripts, expectations), removed
    after the test.  Also returns the host-side mount point to use for the case (under CHROOT/mnt/)."""
    root, _ = chroot_dir
    made = []

    def stage(name, *files):
        tag = f"ckptfs-test-{os.getpid()}-{name}"
        host = os.path.join(root, "tmp", tag)
        shutil.rmtree(host, ignore_errors=True)
        os.makedirs(host)
        made.append(host)
        for f in files:
            shutil.copy(f, host)
        mnt = os.path.join(root, "mnt", tag)
        made.append(mnt)
        return host, "/tmp/" + tag, mnt, "/mnt/" + tag

    yield stage
    for p in made:
        if os.path.isdir(p) and not os.path.ismount(p):
            shutil.rmtree(p, ignore_errors=True)


def in_chroot(root, *args, timeout=CLIENT_TIMEOUT):
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
           "OMP_NUM_THREADS=2", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PYTHONDONTWRITEBYTECODE=1"]
    return H.run(["chroot", root, *env, *args], timeout=timeout)


def expected_dir(fixtures_dir, name):
    info = case_info(fixtures_dir, name)
    return info, os.path.join(fixtures_dir, name, info["expected"][info["latest"]])


@pytest.mark.parametrize("name", CASES)
def test_modern_clients_read_the_mount(chroot_dir, staged, fixtures_dir, ckptfs_bin, name):
    root, versions = require(chroot_dir)
    info, exp = expected_dir(fixtures_dir, name)
    host, inside, mnt, mnt_inside = staged(name, os.path.join(HERE, "chroot_clients.py"),
                                           os.path.join(exp, "model.pt"), os.path.join(exp, "fp32.pt"))
    src = os.path.join(fixtures_dir, name, info["src"])
    with mounted(ckptfs_bin, src, mnt):
        proc = in_chroot(root, "python3", f"{inside}/chroot_clients.py", mnt_inside, inside)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, \
        f"modern clients (torch {versions.get('torch')}, safetensors {versions.get('safetensors')}):\n" \
        f"{H.describe(proc)}"
    assert proc.stdout.count("PASS ") == 8, H.describe(proc)


def test_check_hf_load_in_chroot(chroot_dir, staged, fixtures_dir, ckptfs_bin):
    """mount_tests/device/check_hf_load.py on the Llama case: everything it can do with the chroot's
    packages (all of it if trixie has transformers; the safetensors part otherwise)."""
    root, versions = require(chroot_dir)
    info, exp = expected_dir(fixtures_dir, LLAMA)
    script = os.path.join(TESTS, "device", "check_hf_load.py")
    host, inside, mnt, mnt_inside = staged(LLAMA, script, os.path.join(exp, "model.pt"))
    have_tf = versions.get("transformers", "absent") != "absent"
    args = [] if have_tf else ["--safetensors-only"]
    with mounted(ckptfs_bin, os.path.join(fixtures_dir, LLAMA, info["src"]), mnt):
        proc = in_chroot(root, "python3", f"{inside}/check_hf_load.py", mnt_inside, f"{inside}/model.pt", *args)
    assert proc.returncode == 0, H.describe(proc)
    assert "FAIL" not in proc.stdout and "RESULT: PASS" in proc.stdout, H.describe(proc)
    if have_tf:
        assert "PASS transformers from_pretrained" in proc.stdout and "PASS forward pass" in proc.stdout, H.describe(proc)
