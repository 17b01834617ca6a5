"""`ckptfs export` draws a progress bar only when stderr is a terminal."""
import subprocess

import helpers as H
from test_export import src_of

CASE = "z3_bf16_dp2"


def test_progress_bar_on_a_terminal_only(ckptfs_bin, fixtures_dir, tmp_path):
    src = src_of(fixtures_dir, CASE)
    code, drawn = H.run_with_terminal_stderr([ckptfs_bin, "export", src, tmp_path / "tty"])
    assert code == 0
    assert b"100.0%" in drawn and b"fp32/model.safetensors" in drawn, drawn

    r = subprocess.run([ckptfs_bin, "export", src, tmp_path / "pipe"], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b""
