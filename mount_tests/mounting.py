"""Mounting ckptfs from tests: every mount is undone, even when the test fails, and nothing waits forever.

Every mount says where its index cache is (``index_cache``): by default ``off``, so a mount parses its
sources and never loads an index an earlier test wrote; a test of the index passes its own folder, and
``None`` leaves the binary's default ($XDG_CACHE_HOME/ckptfs, a folder of the test's own: conftest.py)."""
import contextlib
import os
import subprocess
import time

MOUNT_TIMEOUT = 120  # indexing + building the tree + mounting a test checkpoint
CMD_TIMEOUT = 60


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def unmount(path):
    """fusermount3 -u, then a lazy unmount if the mount is busy or the server is gone."""
    if not is_mounted(path):
        return
    r = subprocess.run(["fusermount3", "-u", path], capture_output=True, timeout=CMD_TIMEOUT)
    if r.returncode != 0 and is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True, timeout=CMD_TIMEOUT)


def server_pids(mountpoint):
    """Pids of ckptfs processes whose command line names `mountpoint`."""
    mountpoint = os.path.realpath(mountpoint)
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and os.path.basename(args[0]) == b"ckptfs" and mountpoint.encode() in args:
            pids.append(int(pid))
    return pids


def wait_until(predicate, timeout=CMD_TIMEOUT, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def run_ckptfs(binary, *args, timeout=MOUNT_TIMEOUT):
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def index_option(index_cache):
    """The -o index_cache option of a mount: [] for None (the binary's default); a later -o among the test's
    own options would override it."""
    return [] if index_cache is None else ["-o", f"index_cache={index_cache}"]


@contextlib.contextmanager
def mounted(binary, source, mountpoint, *options, index_cache="off"):
    """Mounts `source` on `mountpoint` (created if needed) with `ckptfs SRC MNT -o index_cache=... OPTIONS...`,
    which returns once the mount is live; yields the mount point; always unmounts and waits for the server to
    exit."""
    os.makedirs(mountpoint, exist_ok=True)
    r = run_ckptfs(binary, source, mountpoint, *index_option(index_cache), *options)
    try:
        assert r.returncode == 0, f"ckptfs {source} {mountpoint} failed ({r.returncode}): {r.stderr}"
        assert is_mounted(mountpoint), "ckptfs returned 0 but nothing is mounted"
        yield str(mountpoint)
    finally:
        unmount(str(mountpoint))
        wait_until(lambda: not server_pids(mountpoint))


@contextlib.contextmanager
def foreground(binary, source, mountpoint, *options, index_cache="off"):
    """Runs `ckptfs -f` (stderr captured; index cache as for `mounted`) and yields the process once the mount
    is live; always unmounts and reaps it."""
    os.makedirs(mountpoint, exist_ok=True)
    proc = subprocess.Popen([str(binary), str(source), str(mountpoint), "-f", *index_option(index_cache),
                             *map(str, options)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: is_mounted(mountpoint) or proc.poll() is not None, MOUNT_TIMEOUT)
        assert proc.poll() is None, f"ckptfs -f exited with {proc.returncode}"
        yield proc
    finally:
        unmount(str(mountpoint))
        try:
            proc.wait(timeout=CMD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=CMD_TIMEOUT)
