"""`ls -lR`, `du` and `stat` on the mount are answered from the tree built at mount time: they touch no
byte of the source shards. Watched with inotify (IN_ACCESS fires on every read of a watched file)."""
import ctypes
import os
import struct
import subprocess

from conftest import case_info
from mounting import CMD_TIMEOUT, mounted

IN_ACCESS = 0x1
IN_NONBLOCK = 0o4000
CASE = "z3_bf16_dp4"


class AccessWatch:
    def __init__(self, paths):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.names = {}
        for p in paths:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(p), IN_ACCESS)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self.names[wd] = os.path.basename(p)

    def accessed(self):
        """Names of the watched files read since the last call."""
        seen = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return seen
            offset = 0
            while offset < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, offset)
                if mask & IN_ACCESS:
                    seen.add(self.names[wd])
                offset += 16 + length

    def close(self):
        os.close(self.fd)


def test_walking_the_mount_reads_no_shard_byte(ckptfs_bin, fixtures_dir, tmp_path):
    src = os.path.join(fixtures_dir, CASE, case_info(fixtures_dir, CASE)["src"])
    tag_dir = os.path.join(src, "global_step3")
    shards = [os.path.join(tag_dir, f) for f in os.listdir(tag_dir)]
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        watch = AccessWatch(shards)
        try:
            for cmd in (["ls", "-lR", mnt], ["du", "-s", mnt], ["du", "-sb", mnt], ["find", mnt, "-type", "f"]):
                r = subprocess.run(cmd, capture_output=True, timeout=CMD_TIMEOUT)
                assert r.returncode == 0, r.stderr
            for root, _, files in os.walk(mnt):
                for f in files:
                    os.stat(os.path.join(root, f))
            assert watch.accessed() == set()
            # The watch does see reads: the first bytes of the weights come from the rank shards.
            with open(os.path.join(mnt, "model.safetensors"), "rb") as f:
                header = int.from_bytes(f.read(8), "little")
                f.seek(8 + header)
                assert f.read(4096)
            assert watch.accessed() & {os.path.basename(s) for s in shards if "optim_states" in s}
        finally:
            watch.close()
