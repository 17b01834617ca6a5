"""End-to-end tests of `ckptfs SRC MNT`: every generated case is mounted and read through real clients
(ls, du, cmp, pread, mmap, parallel readers, torch.load, a safetensors parser) and compared byte for byte
with `ckptfs export` and with the generator's expectations; then the failure modes: writes, changed
sources, busy unmounts, signals, bad checkpoints, and mount(8)/fstab."""
import contextlib
import errno
import hashlib
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
import zipfile

import pytest
import torch

import helpers as H
from conftest import case_info
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


@pytest.fixture(scope="module", params=CASES)
def mounted_case(request, fixtures_dir, ckptfs_bin, export_cache, tmp_path_factory):
    """(case info, source, mount point, export dir) for one case, mounted for all the tests of the case."""
    name = request.param
    src = source_of(fixtures_dir, name)
    proc, out = export_cache(src)
    H.assert_ok(proc)
    with mounted(ckptfs_bin, src, tmp_path_factory.mktemp(f"mnt-{name}")) as mnt:
        yield case_info(fixtures_dir, name), src, mnt, str(out)


def pread_exact(fd, n, offset):
    out = bytearray()
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def boundaries(path):
    """Offsets where a header ends or a tensor's bytes begin: the seams a view is stitched at."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".safetensors"):
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        header.pop("__metadata__", None)
        return sorted({8, 8 + n} | {8 + n + v["data_offsets"][i] for v in header.values() for i in (0, 1)})
    with zipfile.ZipFile(path) as z:
        return sorted({i.header_offset for i in z.infolist()} | {len(data) - 22})


# ---------------------------------------------------------------------------------------------------
# every case

def test_walk_sizes_and_blocks(mounted_case):
    case, src, mnt, out = mounted_case
    ls = subprocess.run(["ls", "-lR", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert ls.returncode == 0, ls.stderr
    total = 0
    for root, dirs, files in os.walk(mnt):
        for f in files:
            st = os.stat(os.path.join(root, f))
            assert st.st_blocks == math.ceil(st.st_size / 512), f
            assert st.st_mode & 0o777 == 0o444, f
            total += st.st_size
    for v in VIEWS:
        assert os.stat(os.path.join(mnt, v)).st_size == os.path.getsize(os.path.join(out, v)), v
    du = subprocess.run(["du", "-sb", mnt], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert int(du.stdout.split()[0]) == total
    info = json.loads(open(os.path.join(mnt, "ckptfs.json")).read())
    assert info["root_tag"] == case["latest"]
    assert [t["name"] for t in info["tags"]] == case["tags"]


def test_views_equal_export(mounted_case):
    case, src, mnt, out = mounted_case
    for v in VIEWS:
        r = subprocess.run(["cmp", os.path.join(mnt, v), os.path.join(out, v)], capture_output=True,
                           text=True, timeout=CMD_TIMEOUT)
        assert r.returncode == 0, f"{v}: {r.stdout}{r.stderr}"


def test_random_and_seam_preads(mounted_case):
    case, src, mnt, out = mounted_case
    rng = random.Random(case["name"])
    for v in VIEWS:
        ref = open(os.path.join(out, v), "rb").read()
        fd = os.open(os.path.join(mnt, v), os.O_RDONLY)
        try:
            for _ in range(64):
                n = rng.choice([1, 2, 3, 7, 512, 4095, 4096, 65537, MIB, 4 * MIB])
                off = rng.randrange(0, len(ref) + 1)
                assert pread_exact(fd, n, off) == ref[off:off + n], f"{v}: {n} bytes at {off}"
            for b in boundaries(os.path.join(out, v)):
                for d in (1, 3, 8, 4097):
                    lo = max(0, b - d)
                    assert pread_exact(fd, 2 * d, lo) == ref[lo:lo + 2 * d], f"{v}: seam at {b}"
        finally:
            os.close(fd)


def test_mmap_shared_and_private(mounted_case):
    case, src, mnt, out = mounted_case
    for v in VIEWS:
        ref = open(os.path.join(out, v), "rb").read()
        with open(os.path.join(mnt, v), "rb") as f:
            for flags in (mmap.MAP_SHARED, mmap.MAP_PRIVATE):
                with mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as m:
                    assert m[:] == ref, v


def test_parallel_readers(mounted_case):
    case, src, mnt, out = mounted_case
    v = VIEWS[1]
    ref = open(os.path.join(out, v), "rb").read()
    chunk = 64 * 1024
    want = [hashlib.sha256(ref[o:o + chunk]).hexdigest() for o in range(0, len(ref), chunk)]
    errors = []

    def reader(seed):
        try:
            order = list(range(len(want)))
            random.Random(seed).shuffle(order)
            fd = os.open(os.path.join(mnt, v), os.O_RDONLY)
            try:
                for i in order:
                    if hashlib.sha256(pread_exact(fd, chunk, i * chunk)).hexdigest() != want[i]:
                        errors.append(f"reader {seed}: chunk {i}")
            finally:
                os.close(fd)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"reader {seed}: {e!r}")

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=CMD_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert not errors, errors[:5]


def test_clients_load_from_the_mount(mounted_case, fixtures_dir):
    case, src, mnt, out = mounted_case
    exp = os.path.join(fixtures_dir, case["name"], case["expected"][case["latest"]])
    fp32 = H.load_expected(os.path.join(exp, "fp32.pt"))
    H.assert_state_equal(torch.load(os.path.join(mnt, "fp32/pytorch_model.bin"), weights_only=True), fp32, True,
                         "fp32/pytorch_model.bin")
    H.assert_state_equal(H.read_safetensors(os.path.join(mnt, "fp32/model.safetensors")), fp32, False,
                         "fp32/model.safetensors")
    H.assert_state_equal(H.read_safetensors(os.path.join(mnt, "model.safetensors")),
                         H.load_expected(os.path.join(exp, "model.pt")), False, "model.safetensors")


def test_tags(mounted_case, fixtures_dir):
    case, src, mnt, out = mounted_case
    assert sorted(os.listdir(os.path.join(mnt, "tags"))) == sorted(case["tags"])
    for tag in case["tags"]:
        for v in VIEWS:
            assert os.path.isfile(os.path.join(mnt, "tags", tag, v)), f"tags/{tag}/{v}"
        exp = os.path.join(fixtures_dir, case["name"], case["expected"][tag])
        H.assert_state_equal(torch.load(os.path.join(mnt, "tags", tag, "fp32/pytorch_model.bin"), weights_only=True),
                             H.load_expected(os.path.join(exp, "fp32.pt")), True, f"tags/{tag}")
    for v in VIEWS:
        r = subprocess.run(["cmp", os.path.join(mnt, v), os.path.join(mnt, "tags", case["latest"], v)],
                           capture_output=True, timeout=CMD_TIMEOUT)
        assert r.returncode == 0, v


def test_side_files(mounted_case):
    case, src, mnt, out = mounted_case
    names = ["config.json", "tokenizer.json"] if case["side_files"] else []
    for n in names:
        with open(os.path.join(src, n), "rb") as a, open(os.path.join(mnt, n), "rb") as b:
            assert a.read() == b.read(), n
    expected_root = {"model.safetensors", "fp32", "tags", "ckptfs.json", *names}
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
