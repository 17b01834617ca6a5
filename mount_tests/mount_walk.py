"""The walk of a mounted tree shared by test_mount.py (DeepSpeed cases) and test_dcp.py (DCP cases)."""
import math
import os
import subprocess

from mounting import CMD_TIMEOUT


def walk_sizes(mnt, dir_mode=None):
    """`ls -lR mnt` succeeds; every file has st_blocks = ceil(size / 512) and mode 0444 (every folder
    `dir_mode` when given).  Returns {inode: size}: the root views and tags/<latest>/ are hard links, which du
    counts once."""
    ls = subprocess.run(["ls", "-lR", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert ls.returncode == 0, ls.stderr
    sizes = {}
    for root, dirs, files in os.walk(mnt):
        for f in files:
            st = os.stat(os.path.join(root, f))
            assert st.st_blocks == math.ceil(st.st_size / 512), f
            assert st.st_mode & 0o777 == 0o444, f
            sizes[st.st_ino] = st.st_size
        if dir_mode is not None:
            for dn in dirs:
                assert os.stat(os.path.join(root, dn)).st_mode & 0o777 == dir_mode, dn
    return sizes
