"""The systemd template unit: valid for systemd (systemd-analyze verify, with ckptfs installed where the
unit runs it) and hardened without a mount namespace of its own (which would hide the mount)."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(REPO, "systemd", "ckptfs@.service")
NAMESPACED = ("PrivateTmp", "ProtectHome", "ProtectSystem", "PrivateDevices", "ReadOnlyPaths", "ProtectKernelModules",
              "ProtectKernelTunables", "ProtectControlGroups", "PrivateMounts", "TemporaryFileSystem")


def settings():
    with open(UNIT) as f:
        return dict(l.strip().split("=", 1) for l in f if "=" in l and not l.lstrip().startswith("#"))


def test_unit_hardening_keeps_the_mount_visible():
    s = settings()
    assert s["NoNewPrivileges"] == "yes"
    assert s["LimitNOFILE"] == "65536" and s["Restart"] == "on-failure"
    assert not [k for k in NAMESPACED if k in s], "an option that gives the service its own mount namespace"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    if not os.access("/usr/local/bin/ckptfs", os.X_OK):
        pytest.skip("ckptfs is not installed in /usr/local/bin (cmake --install build)")
    unit = tmp_path / "ckptfs@.service"
    shutil.copy(UNIT, unit)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "Overall exposure level" in r.stdout, r.stdout + r.stderr
