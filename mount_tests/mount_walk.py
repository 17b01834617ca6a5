"""Walks of a mounted tree shared by test files: test_mount.py (DeepSpeed cases) and test_dcp.py (DCP cases)
check sizes and modes; test_index_cache.py and test_s3_mount.py compare whole trees."""
import json
import math
import os
import subprocess

from mounting import CMD_TIMEOUT


def walk_sizes(mnt):
    """`ls -lR mnt` succeeds; every file has st_blocks = ceil(size / 512) and is read-only (read bits only: which
    of them the sources decide, test_permissions.py checks them), every folder has x where it has r and no w.
    Returns {inode: size}: the root views and tags/<latest>/ are hard links, which du counts once."""
    ls = subprocess.run(["ls", "-lR", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert ls.returncode == 0, ls.stderr
    sizes = {}
    for root, dirs, files in os.walk(mnt):
        for f in files:
            st = os.stat(os.path.join(root, f))
            assert st.st_blocks == math.ceil(st.st_size / 512), f
            assert st.st_mode & 0o777 & ~0o444 == 0 and st.st_mode & 0o400, f"{f}: {st.st_mode:o}"
            sizes[st.st_ino] = st.st_size
        for dn in dirs:
            mode = os.stat(os.path.join(root, dn)).st_mode & 0o777
            assert mode & 0o400 and mode == (mode & 0o444) | (mode & 0o444) >> 2, f"{dn}: {mode:o}"
    return sizes


def tree_of(mnt):
    """{path relative to the mount: the file's bytes, or None for a directory} of everything in a mount."""
    tree = {}
    for root, dirs, files in os.walk(mnt):
        for d in dirs:
            tree[os.path.relpath(os.path.join(root, d), mnt)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                tree[os.path.relpath(os.path.join(root, f), mnt)] = fh.read()
    return tree


def info_without_live(info_bytes):
    """ckptfs.json's content as a snapshot has it: a live mount's adds how it follows its save dir ("live"),
    which differs between a local mount (inotify), an s3:// one (a poll) and `ckptfs cat` (none)."""
    info = json.loads(info_bytes)
    info.pop("live", None)
    return info
