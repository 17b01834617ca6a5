"""No silent short reads: a shard truncated or rewritten in place under a live mount gives EIO for the
reads that need it, through the splice path (fp32 masters served as fp32, passthrough side files: their
bytes go from the shard to /dev/fuse without passing through ckptfs) and the copy path (bf16 converted
from the masters), never short or wrong bytes; one log line names the view and the shard, and a file
that does not read the changed shard still reads correctly. Complements test_mount.py's changed-source
tests (open after the change), which the tiny default cases cannot take through the splice path."""
import errno
import glob
import os
import shutil
import subprocess

import pytest

from conftest import generate_only
from mounting import foreground

CASE = "source_reads_z3_dp8"  # 8 rank files of 1.4 MB: every master run is >= 16 KiB, so it is spliced
MIB = 1 << 20
SPLICED = "fp32/model.safetensors"  # fp32 masters as fp32: no conversion
COPIED = "model.safetensors"  # bf16 from the fp32 masters: converted in ckptfs' buffer


@pytest.fixture
def source(tmp_path):
    """A private copy of the case with a 2 MiB passthrough side file (spliced, reads no shard)."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(generate_only([CASE]), CASE, "checkpoint"), src)
    (src / "side.bin").write_bytes(os.urandom(2 * MIB))
    return src


def rank_file(src, rank):
    return glob.glob(os.path.join(src, "global_step3", f"*zero_pp_rank_{rank}_*optim_states.pt"))[0]


def read_at(path, offset, length):
    """One read of `length` bytes at `offset` (>= 512 KiB: whole FUSE requests); OSError on failure."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def dd(path):
    return subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("view", [SPLICED, COPIED], ids=["spliced", "copied"])
def test_reads_of_a_truncated_shard_fail_with_eio(ckptfs_bin, source, tmp_path, view):
    shard = rank_file(source, 1)
    with foreground(ckptfs_bin, source, tmp_path / "mnt") as proc:
        mnt = tmp_path / "mnt"
        path = str(mnt / view)
        held = os.open(path, os.O_RDONLY)  # opened before the change: open checks it, reads must too
        direct = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            os.truncate(shard, os.path.getsize(shard) // 2)
            assert_direct_reads_fail_with_eio(direct)
            with pytest.raises(OSError) as e:  # the whole view, 1 MiB at a time
                while os.read(held, MIB):
                    pass
            assert e.value.errno == errno.EIO
        finally:
            os.close(held)
            os.close(direct)
        r = dd(path)
        assert r.returncode != 0 and "Input/output error" in r.stderr, r
        assert_rest_of_mount_works(mnt, source)
    assert_logged_once(proc.stderr.read(), view, shard)


def test_spliced_reads_of_a_shard_rewritten_in_place_fail_with_eio(ckptfs_bin, source, tmp_path):
    """Same size, same inode, other bytes: O_DIRECT, so that each read is one request of the spliced view
    (a buffered reader's kernel retries a failed readahead page by page, and requests that small are
    copied, not spliced: the copy path reads such a shard as it is now, see docs/mount.md)."""
    shard = rank_file(source, 1)
    with foreground(ckptfs_bin, source, tmp_path / "mnt") as proc:
        mnt = tmp_path / "mnt"
        held = os.open(str(mnt / SPLICED), os.O_RDONLY | os.O_DIRECT)
        try:
            size = os.path.getsize(shard)
            with open(shard, "r+b") as f:
                f.seek(size // 2)
                f.write(bytes(size - size // 2))
            assert_direct_reads_fail_with_eio(held)
        finally:
            os.close(held)
        assert_rest_of_mount_works(mnt, source)
    assert_logged_once(proc.stderr.read(), SPLICED, shard)


def assert_direct_reads_fail_with_eio(fd):
    """Reads the file behind `fd` (O_DIRECT) request by request: those that fail say EIO, none is short."""
    size, request = os.fstat(fd).st_size, 512 << 10
    failures = []
    for offset in range(0, size, request):
        try:
            assert len(os.pread(fd, request, offset)) == min(request, size - offset), offset
        except OSError as e:
            failures.append(e.errno)
    assert failures and set(failures) == {errno.EIO}, failures


def assert_rest_of_mount_works(mnt, source):
    """A spliced side file that reads no shard: its bytes exact."""
    assert read_at(str(mnt / "side.bin"), 0, 2 * MIB) == (source / "side.bin").read_bytes()
    assert dd(str(mnt / "side.bin")).returncode == 0


def assert_logged_once(log, view, shard):
    lines = [line for line in log.splitlines() if os.path.basename(shard) in line]
    assert len(lines) == 1 and f"/{view}" in lines[0], log


def test_an_unchanged_mount_reads_whole_views_through_dd(ckptfs_bin, source, tmp_path):
    """The checks cost no false alarm: every view reads to its end, with nothing logged."""
    with foreground(ckptfs_bin, source, tmp_path / "mnt") as proc:
        for view in (SPLICED, COPIED, "side.bin"):
            path = str(tmp_path / "mnt" / view)
            data = read_at(path, 0, os.path.getsize(path))
            assert len(data) == os.path.getsize(path), view
            r = dd(path)
            assert r.returncode == 0, r
        assert read_at(str(tmp_path / "mnt" / "side.bin"), 0, 2 * MIB) == (source / "side.bin").read_bytes()
    assert "changed" not in proc.stderr.read()
