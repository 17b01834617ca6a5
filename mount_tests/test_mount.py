"""End-to-end tests of `ckptfs SRC MNT`: every generated case is mounted and read through real clients
(ls, du, cmp, pread, mmap, parallel readers, torch.load, a safetensors parser) and compared with the
generator's expectations (mount_tests/gen/generate.py, computed from its own master values, never by
ckptfs): each view, read front to back, must parse to the expected tensors bit for bit, and every other
read (random and seam preads, mmap, parallel readers, tags/) must return those same bytes; then the failure
modes: writes, changed sources, busy unmounts, signals, bad checkpoints, and mount(8)/fstab."""
import contextlib
import errno
import hashlib
import io
import json
import math
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile

import pytest
import torch

import helpers as H
from conftest import case_info
from mount_walk import walk_sizes
from mounting import (CMD_TIMEOUT, foreground, is_mounted, mounted, run_ckptfs, server_pids, unmount,
                      wait_until)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))
import generate  # noqa: E402

CASES = [c["name"] for c in generate.make_cases()]
VIEWS = ["model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors"]
SIDE_CASE = "z2_bf16_dp2"  # two ranks, side files, ZeRO-2: fp32 views read the optimizer shards only
MIB = 1 << 20


def source_of(fixtures_dir, name):
    return os.path.join(fixtures_dir, name, case_info(fixtures_dir, name)["src"])


def expected_views(fixtures_dir, case, tag=None):
    """{view: (expected {name: tensor}, whether its order is part of the format)} from the generator's files."""
    exp = os.path.join(fixtures_dir, case["name"], case["expected"][tag or case["latest"]])
    fp32, model = H.load_expected(os.path.join(exp, "fp32.pt")), H.load_expected(os.path.join(exp, "model.pt"))
    return {"model.safetensors": (model, False), "fp32/pytorch_model.bin": (fp32, True),
            "fp32/model.safetensors": (fp32, False)}


def parse_view(view, raw):
    """The tensors in the bytes of a view, read as its clients read it (an own safetensors parser, torch.load)."""
    if view.endswith(".safetensors"):
        return H.parse_safetensors(raw, view)
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def assert_view_holds(view, raw, expected):
    want, ordered = expected[view]
    H.assert_state_equal(parse_view(view, raw), want, ordered, view)


@pytest.fixture(scope="module", params=CASES)
def mounted_case(request, fixtures_dir, ckptfs_bin, tmp_path_factory):
    """(case info, source, mount point, {view: bytes}) for one case, mounted for all the tests of the case.
    The bytes are each view read front to back through the mount, checked here against the generator's
    expected tensors: the reference every other read of the case is compared with."""
    name = request.param
    case, src = case_info(fixtures_dir, name), source_of(fixtures_dir, name)
    expected = expected_views(fixtures_dir, case)
    with mounted(ckptfs_bin, src, tmp_path_factory.mktemp(f"mnt-{name}")) as mnt:
        refs = {}
        for v in VIEWS:
            with open(os.path.join(mnt, v), "rb") as f:
                refs[v] = f.read()
            assert_view_holds(v, refs[v], expected)
        yield case, src, mnt, refs


def pread_exact(fd, n, offset):
    out = bytearray()
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def in_threads(work, n):
    """Runs work(i) for i in range(n) in n threads; asserts that none hangs, raises or returns a complaint
    (a string)."""
    errors = []

    def run(i):
        try:
            complaint = work(i)
            if complaint:
                errors.append(f"thread {i}: {complaint}")
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=CMD_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[:5]


def boundaries(view, data):
    """Offsets where a header ends or a tensor's bytes begin in the bytes of a view: the seams it is stitched at."""
    if view.endswith(".safetensors"):
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        header.pop("__metadata__", None)
        return sorted({8, 8 + n} | {8 + n + v["data_offsets"][i] for v in header.values() for i in (0, 1)})
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return sorted({i.header_offset for i in z.infolist()} | {len(data) - 22})


# ---------------------------------------------------------------------------------------------------
# every case

def test_walk_sizes_and_blocks(mounted_case):
    case, src, mnt, refs = mounted_case
    sizes = walk_sizes(mnt)  # by inode, as du counts
    for v in VIEWS:
        st, tagged = os.stat(os.path.join(mnt, v)), os.stat(os.path.join(mnt, "tags", case["latest"], v))
        assert st.st_size == len(refs[v]), v
        assert (st.st_ino, st.st_nlink) == (tagged.st_ino, 2), f"{v} and tags/<latest>/{v} are one inode"
    du = subprocess.run(["du", "-sb", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert int(du.stdout.split()[0]) == sum(sizes.values())
    info = json.loads(open(os.path.join(mnt, "ckptfs.json")).read())
    assert info["root_tag"] == case["latest"]
    assert [t["name"] for t in info["tags"]] == case["tags"]


def test_cat_reads_the_checked_bytes(mounted_case):
    """cat (128 KiB reads, the kernel's readahead) through a pipe returns the bytes the fixture checked."""
    case, src, mnt, refs = mounted_case
    for v in VIEWS:
        r = subprocess.run(["cat", os.path.join(mnt, v)], capture_output=True, timeout=CMD_TIMEOUT)
        assert r.returncode == 0 and r.stdout == refs[v], f"{v}: {r.stderr}"


def test_random_and_seam_preads(mounted_case):
    case, src, mnt, refs = mounted_case
    rng = random.Random(case["name"])
    for v in VIEWS:
        ref = refs[v]
        fd = os.open(os.path.join(mnt, v), os.O_RDONLY)
        try:
            for _ in range(64):
                n = rng.choice([1, 2, 3, 7, 512, 4095, 4096, 65537, MIB, 4 * MIB])
                off = rng.randrange(0, len(ref) + 1)
                assert pread_exact(fd, n, off) == ref[off:off + n], f"{v}: {n} bytes at {off}"
            for b in boundaries(v, ref):
                for d in (1, 3, 8, 4097):
                    lo = max(0, b - d)
                    assert pread_exact(fd, 2 * d, lo) == ref[lo:lo + 2 * d], f"{v}: seam at {b}"
        finally:
            os.close(fd)


def test_mmap_shared_and_private(mounted_case):
    case, src, mnt, refs = mounted_case
    for v in VIEWS:
        ref = refs[v]
        with open(os.path.join(mnt, v), "rb") as f:
            for flags in (mmap.MAP_SHARED, mmap.MAP_PRIVATE):
                with mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as m:
                    assert m[:] == ref, v


def test_parallel_readers(mounted_case):
    case, src, mnt, refs = mounted_case
    v = VIEWS[1]
    ref = refs[v]
    chunk = 64 * 1024
    want = [hashlib.sha256(ref[o:o + chunk]).hexdigest() for o in range(0, len(ref), chunk)]

    def reader(seed):
        order = list(range(len(want)))
        random.Random(seed).shuffle(order)
        fd = os.open(os.path.join(mnt, v), os.O_RDONLY)
        try:
            bad = [i for i in order if hashlib.sha256(pread_exact(fd, chunk, i * chunk)).hexdigest() != want[i]]
        finally:
            os.close(fd)
        return bad and f"chunks {bad[:5]} differ"

    in_threads(reader, 8)


def test_clients_load_from_the_mount(mounted_case, fixtures_dir):
    """torch.load and the safetensors parser open the mounted files themselves (their own seeks and reads)."""
    case, src, mnt, refs = mounted_case
    expected = expected_views(fixtures_dir, case)
    for v, load in (("fp32/pytorch_model.bin", lambda p: torch.load(p, weights_only=True)),
                    ("fp32/model.safetensors", H.read_safetensors), ("model.safetensors", H.read_safetensors)):
        want, ordered = expected[v]
        H.assert_state_equal(load(os.path.join(mnt, v)), want, ordered, v)


def test_tags(mounted_case, fixtures_dir):
    case, src, mnt, refs = mounted_case
    assert sorted(os.listdir(os.path.join(mnt, "tags"))) == sorted(case["tags"])
    for tag in case["tags"]:
        expected = expected_views(fixtures_dir, case, tag)
        for v in VIEWS:
            with open(os.path.join(mnt, "tags", tag, v), "rb") as f:
                assert_view_holds(v, f.read(), expected)
    for v in VIEWS:
        r = subprocess.run(["cmp", os.path.join(mnt, v), os.path.join(mnt, "tags", case["latest"], v)],
                           capture_output=True, timeout=CMD_TIMEOUT)
        assert r.returncode == 0, v


def test_side_files(mounted_case):
    case, src, mnt, refs = mounted_case
    names = ["config.json", "tokenizer.json"] if case["side_files"] else []
    for n in names:
        with open(os.path.join(src, n), "rb") as a, open(os.path.join(mnt, n), "rb") as b:
            assert a.read() == b.read(), n
    # universal/ wherever the optimizer state is partitioned (not ZeRO-0 with a torch or FP16 optimizer)
    universal = ["universal"] if generate.has_universal(case) else []
    expected_root = {"model.safetensors", "fp32", "tags", "ckptfs.json", *names, *universal}
    assert set(os.listdir(mnt)) == expected_root


# ---------------------------------------------------------------------------------------------------
# one case is enough

@pytest.fixture
def side_case(fixtures_dir, ckptfs_bin, tmp_path):
    src = source_of(fixtures_dir, SIDE_CASE)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        yield src, mnt


def test_writes_fail_with_erofs(side_case):
    src, mnt = side_case
    target = os.path.join(mnt, "model.safetensors")
    attempts = {
        "open for write": lambda: os.open(target, os.O_WRONLY),
        "create": lambda: os.open(os.path.join(mnt, "new"), os.O_WRONLY | os.O_CREAT, 0o644),
        "mkdir": lambda: os.mkdir(os.path.join(mnt, "d")),
        "unlink": lambda: os.unlink(target),
        "rmdir": lambda: os.rmdir(os.path.join(mnt, "fp32")),
        "truncate": lambda: os.truncate(target, 0),
        "rename": lambda: os.rename(target, os.path.join(mnt, "renamed")),
        "chmod": lambda: os.chmod(target, 0o644),
        "symlink": lambda: os.symlink("x", os.path.join(mnt, "link")),
    }
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS, f"{what}: {e.value}"


def test_misses_and_wrong_types(side_case):
    src, mnt = side_case
    for _ in range(2):  # the second miss comes from the kernel's negative cache
        assert not os.path.exists(os.path.join(mnt, "nope"))
    with pytest.raises(NotADirectoryError):
        os.listdir(os.path.join(mnt, "model.safetensors"))
    with pytest.raises(IsADirectoryError):
        open(os.path.join(mnt, "fp32"), "rb").read()


def wait_out_source_check():
    """An open trusts the last passed check of a source for -o source_check_ms (1000 ms by default,
    docs/mount.md): a change right after an open is seen by the opens after that interval."""
    time.sleep(1.05)


def shard_of(src):
    return sorted(os.path.join(src, "global_step3", f) for f in os.listdir(os.path.join(src, "global_step3"))
                  if f.endswith("optim_states.pt"))[0]


def test_changed_source_gives_eio_for_its_views_only(ckptfs_bin, case_copy, tmp_path):
    src = case_copy(SIDE_CASE)
    with foreground(ckptfs_bin, src, tmp_path / "mnt") as proc:
        mnt = str(tmp_path / "mnt")
        fp32 = os.path.join(mnt, "fp32/model.safetensors")
        held = os.open(fp32, os.O_RDONLY)  # opened before the change, not read yet
        try:
            shard = shard_of(src)
            size = os.path.getsize(shard)
            os.truncate(shard, size // 2)
            wait_out_source_check()  # the open above checked the shard
            for v in ("fp32/model.safetensors", "fp32/pytorch_model.bin"):
                with pytest.raises(OSError) as e:
                    open(os.path.join(mnt, v), "rb")
                assert e.value.errno == errno.EIO, v
            with pytest.raises(OSError) as e:  # reads past the new end of the shard
                pread_exact(held, os.fstat(held).st_size, 0)
            assert e.value.errno == errno.EIO
        finally:
            os.close(held)
        # Files that do not read the changed shard still work.
        with open(os.path.join(mnt, "model.safetensors"), "rb") as f:
            assert len(f.read()) == os.path.getsize(os.path.join(mnt, "model.safetensors"))
        assert open(os.path.join(mnt, "config.json"), "rb").read() == open(os.path.join(src, "config.json"), "rb").read()
        json.loads(open(os.path.join(mnt, "ckptfs.json")).read())
    log = proc.stderr.read()
    assert os.path.basename(shard) in log and "fp32/model.safetensors" in log, log


def test_deleted_shard_gives_eio_on_open_and_open_files_keep_their_bytes(ckptfs_bin, case_copy, fixtures_dir,
                                                                          tmp_path):
    src = case_copy(SIDE_CASE)
    expected = expected_views(fixtures_dir, case_info(fixtures_dir, SIDE_CASE))
    with foreground(ckptfs_bin, src, tmp_path / "mnt") as server:
        mnt = str(tmp_path / "mnt")
        held = os.open(os.path.join(mnt, "fp32/model.safetensors"), os.O_RDONLY)
        try:
            shard = shard_of(src)
            os.unlink(shard)
            wait_out_source_check()  # the open above checked the shard
            for v in ("fp32/model.safetensors", "fp32/pytorch_model.bin"):
                with pytest.raises(OSError) as e:
                    open(os.path.join(mnt, v), "rb")
                assert e.value.errno == errno.EIO, v
            # ckptfs holds every shard open: a file opened before the unlink reads the mount-time bytes.
            assert_view_holds("fp32/model.safetensors", pread_exact(held, os.fstat(held).st_size, 0), expected)
        finally:
            os.close(held)
        assert len(open(os.path.join(mnt, "model.safetensors"), "rb").read()) > 0
        assert os.listdir(mnt)
    assert os.path.basename(shard) in server.stderr.read()


@pytest.mark.parametrize("how", ["rewritten in place", "replaced by rename"])
def test_shard_replaced_by_same_size_file_gives_eio(ckptfs_bin, case_copy, tmp_path, how):
    src = case_copy(SIDE_CASE)
    shard = shard_of(src)
    data = open(shard, "rb").read()
    st = os.stat(shard)
    with foreground(ckptfs_bin, src, tmp_path / "mnt") as proc:
        mnt = str(tmp_path / "mnt")
        if how == "rewritten in place":
            with open(shard, "r+b") as f:
                f.write(data)
        else:
            with open(shard + ".new", "wb") as f:
                f.write(data)
            os.rename(shard + ".new", shard)
        # same size and the mtime put back: only the inode (rename) or the ctime (rewrite) tells
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        after = os.stat(shard)
        assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        for _ in range(3):
            with pytest.raises(OSError) as e:
                open(os.path.join(mnt, "fp32/pytorch_model.bin"), "rb")
            assert e.value.errno == errno.EIO
        assert len(open(os.path.join(mnt, "model.safetensors"), "rb").read()) > 0
    log = proc.stderr.read()
    # one line per file and changed shard, however often it is opened
    assert log.count("fp32/pytorch_model.bin") == 1, log
    assert os.path.basename(shard) in log, log


def test_unmount_with_open_readers(ckptfs_bin, fixtures_dir, tmp_path):
    src = source_of(fixtures_dir, SIDE_CASE)
    mnt = str(tmp_path / "mnt")
    with mounted(ckptfs_bin, src, mnt):
        f = open(os.path.join(mnt, "fp32/pytorch_model.bin"), "rb")
        try:
            busy = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
            assert busy.returncode != 0 and is_mounted(mnt), "unmount succeeded with a file open"
            lazy = subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, text=True,
                                  timeout=CMD_TIMEOUT)
            assert lazy.returncode == 0, lazy.stderr
            assert not is_mounted(mnt)
            assert f.read(16)  # the open file keeps working after a lazy unmount
        finally:
            f.close()
        assert wait_until(lambda: not server_pids(mnt)), "the server did not exit after the last close"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts(ckptfs_bin, fixtures_dir, tmp_path, sig):
    mnt = str(tmp_path / "mnt")
    with mounted(ckptfs_bin, source_of(fixtures_dir, SIDE_CASE), mnt):
        pids = server_pids(mnt)
        assert len(pids) == 1, pids
        os.kill(pids[0], sig)
        assert wait_until(lambda: not server_pids(mnt)), "the server did not exit"
        assert not is_mounted(mnt)


def test_sigkill_leaves_a_dead_mount_that_fusermount_clears(ckptfs_bin, fixtures_dir, tmp_path):
    """SIGKILL cannot unmount: the mount point answers ENOTCONN until `fusermount3 -u`; mounting again
    before that fails with exit 6 and says so (docs/mount.md)."""
    src, mnt = source_of(fixtures_dir, SIDE_CASE), str(tmp_path / "mnt")
    with mounted(ckptfs_bin, src, mnt):
        os.stat(os.path.join(mnt, "model.safetensors"))  # cached attributes must not fool the check
        pids = server_pids(mnt)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        assert wait_until(lambda: not server_pids(mnt)), "the server survived SIGKILL"
        assert is_mounted(mnt)

        def listdir_errno():
            try:
                os.listdir(mnt)
            except OSError as e:
                return e.errno
            return 0

        # ECONNABORTED while the dying server still holds /dev/fuse, then ENOTCONN for good.
        assert wait_until(lambda: listdir_errno() == errno.ENOTCONN), os.strerror(listdir_errno())
        again = run_ckptfs(ckptfs_bin, src, mnt)
        H.assert_one_line_error(again, 6, [f"fusermount3 -u {mnt}"])
        r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
        assert r.returncode == 0 and not is_mounted(mnt), r.stderr
    with mounted(ckptfs_bin, src, mnt):
        assert "model.safetensors" in os.listdir(mnt)


def test_mounting_twice_on_the_same_point_exits_6(ckptfs_bin, fixtures_dir, tmp_path):
    src, mnt = source_of(fixtures_dir, SIDE_CASE), str(tmp_path / "mnt")
    link = str(tmp_path / "link")
    os.symlink("mnt", link)
    with mounted(ckptfs_bin, src, mnt):
        for target in (mnt, link):
            H.assert_one_line_error(run_ckptfs(ckptfs_bin, src, target), 6, ["already a ckptfs mount"])
        with open("/proc/self/mountinfo") as f:
            assert sum(l.split()[4] == os.path.realpath(mnt) for l in f) == 1
        assert os.listdir(mnt)


def test_foreground_returns_after_unmount(ckptfs_bin, fixtures_dir, tmp_path):
    mnt = str(tmp_path / "mnt")
    with foreground(ckptfs_bin, source_of(fixtures_dir, SIDE_CASE), mnt, "-o", "threads=2") as proc:
        assert os.listdir(mnt)
        unmount(mnt)
        assert proc.wait(timeout=CMD_TIMEOUT) == 0


def test_tag_option(ckptfs_bin, fixtures_dir, tmp_path):
    name = "twotags_z2_bf16_dp2"
    first = case_info(fixtures_dir, name)["tags"][0]
    for opts in (["--tag", first], ["-o", f"tag={first}"]):
        with mounted(ckptfs_bin, source_of(fixtures_dir, name), tmp_path / "mnt", *opts) as mnt:
            assert os.listdir(os.path.join(mnt, "tags")) == [first]
            assert json.load(open(os.path.join(mnt, "ckptfs.json")))["root_tag"] == first


def big_side_file_copy(case_copy, size=24 * MIB):
    """A copy of SIDE_CASE with a side file `big.bin` of `size` random bytes: large reads through ckptfs."""
    src = case_copy(SIDE_CASE)
    data = random.Random(size).randbytes(size)
    with open(os.path.join(src, "big.bin"), "wb") as f:
        f.write(data)
    return src, data


def test_read_sizes_and_offsets(ckptfs_bin, case_copy, tmp_path):
    src, data = big_side_file_copy(case_copy)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        fd = os.open(os.path.join(mnt, "big.bin"), os.O_RDONLY)
        try:
            n = len(data)
            assert os.pread(fd, 0, 0) == b"" and os.pread(fd, 0, n // 2) == b""
            assert os.pread(fd, 4096, n) == b""  # at EOF
            assert os.pread(fd, 4096, n + 12345) == b"" and os.pread(fd, 4096, 1 << 62) == b""  # past it
            assert os.pread(fd, 4096, n - 10) == data[-10:]
            assert pread_exact(fd, 16 * MIB, 12345) == data[12345:12345 + 16 * MIB]
            assert pread_exact(fd, n + 1, 0) == data
        finally:
            os.close(fd)
        # O_DIRECT bypasses the page cache: every request reaches ckptfs, up to max_read each.
        try:
            fd = os.open(os.path.join(mnt, "big.bin"), os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            pytest.skip(f"O_DIRECT: {e}")
        try:
            buf = mmap.mmap(-1, 8 * MIB)  # page-aligned
            got = os.preadv(fd, [buf], 4096)
            assert got == 8 * MIB and buf[:] == data[4096:4096 + 8 * MIB]
            assert os.preadv(fd, [buf], n) == 0
        finally:
            os.close(fd)


def test_one_thread_serves_parallel_uncached_readers(ckptfs_bin, case_copy, tmp_path):
    """-o threads=1: eight readers of a fresh mount (nothing cached) all finish; nothing deadlocks."""
    src, data = big_side_file_copy(case_copy, 8 * MIB)
    chunk = 128 * 1024
    with mounted(ckptfs_bin, src, tmp_path / "mnt", "-o", "threads=1") as mnt:
        def reader(seed):
            order = list(range(0, len(data), chunk))
            random.Random(seed).shuffle(order)
            with open(os.path.join(mnt, "big.bin"), "rb", buffering=0) as f, \
                    open(os.path.join(mnt, "fp32/pytorch_model.bin"), "rb") as g:
                bad = [off for off in order[:24] if pread_exact(f.fileno(), chunk, off) != data[off:off + chunk]]
                g.read()
            return bad and f"big.bin differs at {bad[:5]}"

        in_threads(reader, 8)


def test_many_concurrent_opens_and_closes(side_case):
    src, mnt = side_case
    (pid,) = server_pids(mnt)

    def source_fds():  # each server thread has its own /dev/fuse fd (clone_fd): count the others
        return sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}") != "/dev/fuse")

    fds_before = source_fds()
    names = VIEWS + ["config.json", "ckptfs.json", "tokenizer.json"]

    def opener(seed):
        rng = random.Random(seed)
        for _ in range(200):
            fd = os.open(os.path.join(mnt, rng.choice(names)), os.O_RDONLY)
            try:
                os.fstat(fd)
                os.pread(fd, 64, rng.randrange(0, 4096))
            finally:
                os.close(fd)

    in_threads(opener, 16)
    assert source_fds() == fds_before, "the server leaks file descriptors"


def test_errnos_of_odd_requests(side_case):
    src, mnt = side_case
    target = os.path.join(mnt, "model.safetensors")
    cases = {
        "readlink of a file": (lambda: os.readlink(target), errno.EINVAL),
        "ls of a missing path": (lambda: os.listdir(os.path.join(mnt, "nope", "deeper")), errno.ENOENT),
        "stat below a file": (lambda: os.stat(os.path.join(target, "x")), errno.ENOTDIR),
        "O_DIRECTORY on a file": (lambda: os.open(target, os.O_RDONLY | os.O_DIRECTORY), errno.ENOTDIR),
        "getxattr": (lambda: os.getxattr(target, "user.x"), (errno.ENOTSUP, errno.ENODATA)),
        "open a file for append": (lambda: os.open(target, os.O_WRONLY | os.O_APPEND), errno.EROFS),
        "O_RDONLY|O_TRUNC": (lambda: os.open(target, os.O_RDONLY | os.O_TRUNC), errno.EROFS),
    }
    for what, (attempt, want) in cases.items():
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno in (want if isinstance(want, tuple) else (want,)), f"{what}: {e.value}"
    fd = os.open(os.path.join(mnt, "fp32"), os.O_RDONLY)  # a directory opens for reading, read() says so
    try:
        with pytest.raises(IsADirectoryError):
            os.read(fd, 16)
    finally:
        os.close(fd)
    assert os.listxattr(target) == []


def test_statfs_and_df(side_case):
    src, mnt = side_case
    st = os.statvfs(mnt)
    # every inode once: the root views and tags/<latest>/ share theirs
    stats = {os.stat(r).st_ino for r, _, _ in os.walk(mnt)}
    files = {}
    for r, _, f in os.walk(mnt):
        for n in f:
            st_file = os.stat(os.path.join(r, n))
            files[st_file.st_ino] = st_file.st_size
    nodes = len(stats) + len(files)
    total = sum(files.values())
    assert st.f_flag & os.ST_RDONLY
    assert st.f_bsize == st.f_frsize == 4096 and st.f_namemax == 255
    assert st.f_blocks == math.ceil(total / 4096) and st.f_bfree == st.f_bavail == 0
    assert st.f_files == nodes and st.f_ffree == 0
    df = subprocess.run(["df", "-P", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert df.returncode == 0, df.stderr
    assert df.stdout.splitlines()[1].split()[0] == src


def test_non_empty_mount_point_is_fine(ckptfs_bin, fixtures_dir, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "hidden").write_text("under the mount")
    with mounted(ckptfs_bin, source_of(fixtures_dir, SIDE_CASE), mnt):
        assert "hidden" not in os.listdir(mnt) and "model.safetensors" in os.listdir(mnt)
    assert (mnt / "hidden").read_text() == "under the mount"


def test_relative_paths_survive_the_daemon_chdir(ckptfs_bin, case_copy, tmp_path):
    """The daemon runs in "/": `cd DIR && ckptfs ./ckpt ./mnt` must still read and re-check the sources."""
    src = case_copy(SIDE_CASE)
    (tmp_path / "mnt").mkdir()
    r = subprocess.run([ckptfs_bin, f"./{src.name}", "./mnt"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=CMD_TIMEOUT)
    mnt = str(tmp_path / "mnt")
    try:
        assert r.returncode == 0, r.stderr
        cwds = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                if args[:3] == [ckptfs_bin.encode(), f"./{src.name}".encode(), b"./mnt"]:
                    cwds.append(os.readlink(f"/proc/{pid}/cwd"))
        assert cwds == ["/"], cwds
        for v in VIEWS + ["config.json"]:
            assert len(open(os.path.join(mnt, v), "rb").read()) == os.path.getsize(os.path.join(mnt, v)), v
        with open("/proc/self/mountinfo") as f:
            assert any(l.split()[4] == mnt and f" {src} " in l for l in f), "fsname is not the absolute source"
        os.utime(shard_of(src), ns=(0, 0))  # the sources are still checked, by their absolute paths
        wait_out_source_check()  # the reads above checked them
        with pytest.raises(OSError) as e:
            open(os.path.join(mnt, "fp32/model.safetensors"), "rb")
        assert e.value.errno == errno.EIO
    finally:
        unmount(mnt)
        wait_until(lambda: not is_mounted(mnt))


# ---------------------------------------------------------------------------------------------------
# nothing is mounted when the checkpoint is bad

def assert_refused(proc, code, mnt, names):
    H.assert_one_line_error(proc, code, names)
    assert not is_mounted(mnt)
    assert not server_pids(mnt)


def test_corrupt_checkpoint_exits_4(ckptfs_bin, case_copy, tmp_path):
    src = case_copy(SIDE_CASE)
    shard = shard_of(src)
    os.truncate(shard, os.path.getsize(shard) // 2)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert_refused(run_ckptfs(ckptfs_bin, src, mnt), 4, mnt, [os.path.basename(shard)])


def test_missing_source_exits_3(ckptfs_bin, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert_refused(run_ckptfs(ckptfs_bin, tmp_path / "nope", mnt), 3, mnt, ["nope"])


def test_bad_mount_point_exits_6(ckptfs_bin, fixtures_dir, tmp_path):
    mnt = tmp_path / "missing"
    assert_refused(run_ckptfs(ckptfs_bin, source_of(fixtures_dir, SIDE_CASE), mnt), 6, mnt, ["missing"])
    afile = tmp_path / "afile"
    afile.write_text("")
    proc = run_ckptfs(ckptfs_bin, source_of(fixtures_dir, SIDE_CASE), afile)
    H.assert_one_line_error(proc, 6, ["afile: mount point is not a directory"])


def test_bad_options_exit_2(ckptfs_bin, fixtures_dir, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    src = source_of(fixtures_dir, SIDE_CASE)
    for opts in (["-o", "threads=0"], ["--bogus"], ["-o", "no_such_fuse_option"]):
        proc = run_ckptfs(ckptfs_bin, src, mnt, *opts)
        assert proc.returncode == 2, H.describe(proc)
        assert not is_mounted(mnt)


# ---------------------------------------------------------------------------------------------------
# mount(8) and fstab run mount.fuse3 (/sbin/mount.fuse), which runs `ckptfs SRC MNT -o OPTS` through
# /bin/sh; mount(8) clears PATH, so there the shell's default PATH must find ckptfs.

DEFAULT_SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def assert_mounted_as_ckptfs(src, mnt):
    assert os.path.getsize(os.path.join(mnt, "model.safetensors")) > 0
    with open("/proc/self/mountinfo") as f:
        line = next(l for l in f if l.split()[4] == os.path.realpath(mnt))
    assert " fuse.ckptfs " + src + " " in line and "allow_other" in line, line


@contextlib.contextmanager
def run_mount_helper(cmd, mnt, env=None):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT, env=env)
        assert r.returncode == 0, f"{cmd}: {r.stderr}"
        yield
    finally:
        unmount(mnt)
        wait_until(lambda: not server_pids(mnt))


def test_mount_fuse3_helper(ckptfs_bin, fixtures_dir, tmp_path):
    src, mnt = source_of(fixtures_dir, SIDE_CASE), str(tmp_path / "mnt")
    os.mkdir(mnt)
    env = dict(os.environ, PATH=os.path.dirname(ckptfs_bin) + ":" + DEFAULT_SHELL_PATH)
    # mount(8) passes "rw" (ignored: the mount is always read-only) and the fstab options.
    with run_mount_helper(["/sbin/mount.fuse3", src, mnt, "-t", "ckptfs", "-o", "rw,allow_other"], mnt, env):
        assert_mounted_as_ckptfs(src, mnt)


def test_mount_and_fstab(fixtures_dir, tmp_path):
    installed = shutil.which("ckptfs", path=DEFAULT_SHELL_PATH)
    if installed is None:
        pytest.skip("ckptfs is not installed where mount(8) finds it (e.g. /usr/local/bin)")
    src, mnt = source_of(fixtures_dir, SIDE_CASE), str(tmp_path / "mnt")
    os.mkdir(mnt)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{src} {mnt} fuse.ckptfs defaults,allow_other,nofail 0 0\n")
    with run_mount_helper(["mount", "-t", "fuse.ckptfs", src, mnt, "-o", "allow_other"], mnt):
        assert_mounted_as_ckptfs(src, mnt)
    with run_mount_helper(["mount", "-T", str(fstab), mnt], mnt):
        assert_mounted_as_ckptfs(src, mnt)
        # fsname is the source, so `mount -a` sees the line as mounted and leaves it alone.
        r = subprocess.run(["mount", "-T", str(fstab), "-a"], capture_output=True, text=True, timeout=CMD_TIMEOUT)
        assert r.returncode == 0, r.stderr
        with open("/proc/self/mountinfo") as f:
            assert sum(l.split()[4] == os.path.realpath(mnt) for l in f) == 1


def test_mount_type_ckptfs_uses_the_helper(fixtures_dir, tmp_path):
    """`mount -t ckptfs` and fstab lines of type `ckptfs` go through /sbin/mount.ckptfs (installed by
    `cmake --install`, which .ci/run does)."""
    if not os.access("/sbin/mount.ckptfs", os.X_OK):
        pytest.skip("mount.ckptfs is not installed in /sbin (cmake --install build)")
    src, mnt = source_of(fixtures_dir, SIDE_CASE), str(tmp_path / "mnt")
    os.mkdir(mnt)
    with run_mount_helper(["mount", "-t", "ckptfs", src, mnt, "-o", "allow_other"], mnt):
        assert_mounted_as_ckptfs(src, mnt)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{src} {mnt} ckptfs ro,allow_other,nofail 0 0\n")
    with run_mount_helper(["mount", "-T", str(fstab), mnt], mnt):
        assert_mounted_as_ckptfs(src, mnt)
    # mount -f (fake) must not mount anything.
    r = subprocess.run(["mount", "-f", "-t", "ckptfs", src, mnt], capture_output=True, timeout=CMD_TIMEOUT)
    assert r.returncode == 0 and not is_mounted(mnt)


def test_options_in_any_position_and_escaped_commas(ckptfs_bin, fixtures_dir, tmp_path):
    """`ckptfs --tag T -o ... SRC MNT` works, and -o lists are split by libfuse's parser ("\\," is a comma)."""
    src = source_of(fixtures_dir, SIDE_CASE)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    tag = "global_step3"
    r = subprocess.run([ckptfs_bin, "--tag", tag, "-o", r"fsname=ckpt\,one,threads=2", src, str(mnt)],
                       capture_output=True, text=True, timeout=CMD_TIMEOUT)
    try:
        assert r.returncode == 0, r.stderr
        with open("/proc/self/mounts") as f:
            line = next(l for l in f if l.split()[1] == str(mnt))
        assert line.split()[0] == r"ckpt,one" or line.split()[0] == r"ckpt\054one", line
        assert os.listdir(os.path.join(mnt, "tags")) == [tag]
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=CMD_TIMEOUT)
