"""Thousands of rank files under `ulimit -n 1024` (soft and hard): a 1,024-rank ZeRO-3 tag (2,048 files)
and a save dir of 12 tags x 128 files, mounted, listed and every view read and compared with the
generator's expectations; export and inspect --tag under the same limit."""
import os
import resource
import subprocess
import sys

import pytest
import torch

import helpers as H
from conftest import GENERATOR, GEN_TIMEOUT, case_info
from mounting import CMD_TIMEOUT, MOUNT_TIMEOUT, unmount, wait_until, server_pids, is_mounted

FD_LIMIT = 1024


def limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def run_limited(args, timeout=MOUNT_TIMEOUT):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, preexec_fn=limit_fds)


@pytest.fixture(scope="module")
def scale_dir(fixtures_dir):
    proc = H.run([sys.executable, GENERATOR, fixtures_dir, "--only", "scale_z3_dp1024", "scale_12tags_z3_dp64"],
                 timeout=GEN_TIMEOUT)
    assert proc.returncode == 0, H.describe(proc)
    return fixtures_dir


def expected(root, name, tag):
    d = os.path.join(root, name, case_info(root, name)["expected"][tag])
    return H.load_expected(os.path.join(d, "fp32.pt")), H.load_expected(os.path.join(d, "model.pt"))


def check_views(view_dir, exp_fp32, exp_model, what):
    H.assert_state_equal(torch.load(os.path.join(view_dir, "fp32", "pytorch_model.bin"), weights_only=True),
                         exp_fp32, ordered=True, what=f"{what} fp32/pytorch_model.bin")
    H.assert_state_equal(H.read_safetensors(os.path.join(view_dir, "fp32", "model.safetensors")), exp_fp32,
                         ordered=False, what=f"{what} fp32/model.safetensors")
    H.assert_state_equal(H.read_safetensors(os.path.join(view_dir, "model.safetensors")), exp_model,
                         ordered=False, what=f"{what} model.safetensors")


@pytest.mark.parametrize("name,max_open", [("scale_z3_dp1024", 64), ("scale_12tags_z3_dp64", 64),
                                           ("scale_z3_dp1024", None)])
def test_mount_many_files_at_ulimit_1024(scale_dir, ckptfs_bin, tmp_path, name, max_open):
    """With max_open=64, and with the default: half the fd limit."""
    info = case_info(scale_dir, name)
    src = os.path.join(scale_dir, name, "checkpoint")
    n_files = sum(len(os.listdir(os.path.join(src, t))) for t in info["tags"])
    assert n_files > FD_LIMIT, f"{name}: only {n_files} files, the test needs more than the fd limit"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_limited([ckptfs_bin, src, mnt] + (["-o", f"max_open={max_open}"] if max_open else []))
    try:
        assert r.returncode == 0, H.describe(r)
        assert is_mounted(mnt)
        (pid,) = server_pids(mnt)
        with open(f"/proc/{pid}/limits") as f:
            assert any(l.startswith("Max open files") and l.split()[3] == str(FD_LIMIT) for l in f), \
                "the server does not run under the test's fd limit"
        ls = H.run(["ls", "-lR", mnt], timeout=CMD_TIMEOUT)
        H.assert_ok(ls)
        assert "model.safetensors" in ls.stdout
        H.assert_ok(H.run(["du", "-s", mnt], timeout=CMD_TIMEOUT))
        for tag in info["tags"]:
            exp_fp32, exp_model = expected(scale_dir, name, tag)
            check_views(os.path.join(mnt, "tags", tag), exp_fp32, exp_model, f"{name} tags/{tag}")
        check_views(str(mnt), *expected(scale_dir, name, info["latest"]), f"{name} root")
        # the cache bound holds while serving: max_open source fds, a few for FUSE and the process itself;
        # by default as many as half the limit stay open (the views read all 1,024 optimizer files)
        open_fds = len(os.listdir(f"/proc/{pid}/fd"))
        assert open_fds <= (max_open or FD_LIMIT // 2) + 16, f"{open_fds} descriptors open"
        if max_open is None:
            assert open_fds >= FD_LIMIT // 2, f"{open_fds} descriptors open: the default bound is not half the limit"
    finally:
        unmount(str(mnt))
        wait_until(lambda: not server_pids(mnt))


@pytest.mark.parametrize("name", ["scale_z3_dp1024", "scale_12tags_z3_dp64"])
def test_export_and_inspect_at_ulimit_1024(scale_dir, ckptfs_bin, tmp_path, name):
    info = case_info(scale_dir, name)
    src = os.path.join(scale_dir, name, "checkpoint")
    tag = info["tags"][0]
    r = run_limited([ckptfs_bin, "inspect", src, "--tag", tag])
    H.assert_ok(r)
    assert f"DP {info['dp']}" in r.stdout, r.stdout
    r = run_limited([ckptfs_bin, "inspect", src])
    H.assert_ok(r)
    out = tmp_path / "out"
    r = run_limited([ckptfs_bin, "export", src, out, "--tag", tag])
    H.assert_ok(r)
    check_views(str(out), *expected(scale_dir, name, tag), f"{name} export --tag {tag}")
