"""What a first read through the mount pulls from the sources: with the page cache dropped before the
mount, reading a merged view (front to back with `cat`, or tensor by tensor in shuffled order) brings into
the page cache the fp32 masters it needs and the bytes the indexing read, and not the optimizer states
around them. Measured with mincore(2) on every source file; the view's bytes are checked against the
generator's digests. The case: the bench model at a few MB, ZeRO-3 bf16 over 8 ranks, so each rank file
holds its masters in a third of its bytes (exp_avg and exp_avg_sq around them)."""
import ctypes
import json
import mmap
import os
import random
import shutil
import struct
import subprocess
import sys

import pytest

import helpers as H
from conftest import GENERATOR, GEN_TIMEOUT, case_info
from mounting import mounted

# mincore counts what the first read pulls into the page cache: the tests measure one private copy of the
# case (other modules read the generated case), one at a time.
pytestmark = pytest.mark.xdist_group("source_reads")

CASE = "source_reads_z3_dp8"
PAGE = mmap.PAGESIZE
SLACK_PER_FILE = 64 << 10  # partition padding and page rounding at the ends of each file's masters

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_bytes(path):
    """Bytes of `path` in the page cache (mincore of a mapping that is never touched)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), f"mmap {path}: errno {ctypes.get_errno()}"
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, f"mincore {path}: errno {ctypes.get_errno()}"
            return sum(v & 1 for v in vec) * PAGE
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


@pytest.fixture(scope="module")
def case(fixtures_dir, tmp_path_factory):
    """(the generated case's directory, a private copy of its source that only this module reads, its info)."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        pytest.skip("needs a writable /proc/sys/vm/drop_caches (root)")
    proc = H.run([sys.executable, GENERATOR, fixtures_dir, "--only", CASE], timeout=GEN_TIMEOUT)
    assert proc.returncode == 0, H.describe(proc)
    info = case_info(fixtures_dir, CASE)
    src = tmp_path_factory.mktemp("source_reads") / info["src"]
    shutil.copytree(os.path.join(fixtures_dir, CASE, info["src"]), src)
    return os.path.join(fixtures_dir, CASE), str(src), info


def read_with_cat(path):
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True, timeout=120)


def read_shuffled(path):
    """Each tensor's bytes in 128 KiB preads, the tensors in shuffled order (a loader's pattern)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    spans = [info["data_offsets"] for info in header.values()]
    random.Random(7).shuffle(spans)
    fd = os.open(path, os.O_RDONLY)
    try:
        for b, e in spans:
            for at in range(8 + n + b, 8 + n + e, 128 << 10):
                os.pread(fd, min(128 << 10, 8 + n + e - at), at)
    finally:
        os.close(fd)


@pytest.mark.parametrize("reader", [read_with_cat, read_shuffled], ids=["cat", "shuffled"])
@pytest.mark.parametrize("view,manifest", [("fp32/model.safetensors", "fp32.manifest.json"),
                                           ("model.safetensors", "model.manifest.json")])
def test_first_read_pulls_only_the_masters(case, ckptfs_bin, tmp_path, view, manifest, reader):
    case_dir, src, info = case
    tag_dir = os.path.join(src, info["latest"])
    files = sorted(os.path.join(tag_dir, f) for f in os.listdir(tag_dir))
    masters = info["fp32_master_bytes"]
    assert sum(os.path.getsize(f) for f in files) > 2.5 * masters, "the case must hold more than its masters"
    drop_page_cache()
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", "index_cache=off") as mnt:
        after_mount = sum(map(resident_bytes, files))
        reader(os.path.join(mnt, view))
        after_read = sum(map(resident_bytes, files))
        ours = H.read_safetensors(os.path.join(mnt, view))
    bound = after_mount + masters + len(files) * SLACK_PER_FILE
    assert after_read <= bound, (
        f"{view} ({reader.__name__}): {after_read} bytes of the sources in the page cache after the read, "
        f"more than the {after_mount} the mount read + {masters} of masters + {len(files)} x {SLACK_PER_FILE}: "
        f"readahead went past the ranges the view needs")
    assert after_read >= after_mount + masters // 2, \
        f"{view}: only {after_read - after_mount} bytes came in for {masters} of masters: is mincore working?"
    with open(os.path.join(case_dir, "expected", manifest)) as f:
        expected = json.load(f)
    assert set(ours) == set(expected), f"{view}: names differ from the generator's"
    for name, t in ours.items():
        assert H.sha256_le(t) == expected[name]["sha256"], f"{view}: {name} differs from the generator's"
