"""`ckptfs export` draws a progress bar only when stderr is a terminal."""
import os
import subprocess

from test_export import src_of

CASE = "z3_bf16_dp2"


def test_progress_bar_on_a_terminal_only(ckptfs_bin, fixtures_dir, tmp_path):
    src = src_of(fixtures_dir, CASE)
    master, slave = os.openpty()
    try:
        r = subprocess.run([ckptfs_bin, "export", src, tmp_path / "tty"], stderr=slave, stdout=subprocess.DEVNULL,
                           timeout=60)
        os.close(slave)
        slave = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the terminal's other side is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert r.returncode == 0
    assert b"100.0%" in drawn and b"fp32/model.safetensors" in drawn, drawn

    r = subprocess.run([ckptfs_bin, "export", src, tmp_path / "pipe"], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b""
