"""A live run (issue 30): a mount of a save dir follows the run as it saves (docs/mount.md).

A writer process (mount_tests/live_writer.py) saves tags into a save dir under a live mount as the frameworks
save them: DeepSpeed tags (the generator's ZeRO-2 bf16 DP 2 case, mount_tests/gen/generate.py, other values
per tag) with real ``torch.save`` and ``latest`` written last, and PyTorch DCP step dirs with a real
``torch.distributed.checkpoint.save`` (torch 2.6 in the Debian 13 chroot), whose ``.metadata`` comes last.
For every tag the writer also writes, outside the save dir, what the mount must serve for it: the
generator's expected views computed from its own values (DeepSpeed), the saved model subtree and the
safetensors library's own file of it (DCP). Every read of the mount is judged against those, never against
ckptfs's own output.

What is checked:
- test_deepspeed_tags_appear_as_latest_names_them: readers read the root's model.safetensors and
  fp32/model.safetensors, ckptfs.json and every listed tags/<tag>/model.safetensors without pause while the
  writer saves three tags; every read is the reference of a tag `latest` had named (tags/<tag>/: that very
  tag's), no reader goes back to an older tag, no read fails; a tag being written (half its files) or written
  but not yet named by `latest` is listed under ckptfs.json's in_progress and nowhere else (not under tags/,
  not in ckptfs.json's tags, tags/<it> ENOENT); once `latest` names it, it is listed (tags/ while a reader
  lists it too, ckptfs.json) and the root serves it (polled, 30 s).
- test_deleted_tag_disappears_and_its_open_files_never_read_wrong_bytes: rm -rf of an older tag removes it
  from tags/ (and ckptfs.json); a file of it opened before reads its bytes or fails with EIO, never other
  bytes; the run goes on (a new tag appears after the deletion).
- test_open_files_keep_the_tag_they_were_opened_on: a root file opened (partly read) before `latest` moves
  reads the old tag's bytes to the end, before and after a new open of the same path read the new tag's.
- test_static_mount_never_follows: with `-o static` a new tag never appears and the root stays, while a live
  mount of the same save dir shows it (the control that the change was there to be seen).
- test_dcp_step_dirs_appear_once_their_metadata_is_written: a folder of DCP step dirs; a step-N/ whose data
  files are written but whose .metadata is not yet is in progress, not served; once .metadata is written it
  is listed, served at the root, and its model.safetensors is byte for byte the safetensors library's file of
  the saved model tensors. Needs the chroot (${CKPTFS_CHROOT}, else build/trixie or /var/cache/ckptfs/trixie, made by
  mount_tests/modern/setup_chroot.sh): skipped, saying so, without it.
- test_s3_source_follows_at_the_refresh_interval: the same DeepSpeed save dir uploaded to an S3 store (the
  tests' radosgw, mount_tests/s3_gateway.py; skipped without its chroot) and mounted with `-o refresh=1`: a
  tag whose objects are uploaded is in progress, not served, before its `latest` object names it, then it is
  (polled); a deleted tag's objects take it away.

Every mount is `ckptfs -f` (mounting.foreground: unmounted whatever happens); a failure carries the server's
log, and each server must exit at its unmount.

Changes are polled for (30 s), never waited for with a fixed sleep; only the checks that something does NOT
happen watch the mount for a fixed window (ABSENT_WINDOW, longer than the ~1 s the mount takes to follow).
"""
import collections
import contextlib
import errno
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

import helpers as H
from mounting import CMD_TIMEOUT, foreground
from s3_gateway import s3_gateway  # noqa: F401 (the session fixture)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen_dcp"))
import run_generator as RG  # noqa: E402

WRITER = os.path.join(HERE, "live_writer.py")
POLL_TIMEOUT = 30  # seconds a change may take to show (docs: about a second)
ABSENT_WINDOW = 1.5  # seconds a thing that must not show is watched for
WRITER_TIMEOUT = 120  # one command of the writer (the chroot's first torch import included)


def step_tag(i):
    return f"global_step{i}"


@contextlib.contextmanager
def mount(binary, source, mountpoint, *options):
    """`ckptfs SRC MNT -f` (mounting.foreground: always unmounted, the server reaped); yields the mount point.
    A failure in the block comes back with the server's log (each change it followed, each refresh that
    failed); then the server must have exited at the unmount (a live mount's watcher must not keep it)."""
    failure = None
    with foreground(binary, source, mountpoint, *options) as proc:
        try:
            yield str(mountpoint)
        except AssertionError as e:
            failure = e
    log = proc.stderr.read()
    if failure is not None:
        raise AssertionError(f"{failure}\nckptfs -f log:\n{log[-4000:]}") from failure
    assert proc.returncode == 0, \
        f"the ckptfs server of {mountpoint} exited with {proc.returncode} (-9: still running {CMD_TIMEOUT}s after " \
        f"the unmount, killed)\n{log[-4000:]}"


# ---------------------------------------------------------------------------------------------------
# the writer process

class Writer:
    """live_writer.py as a process: ``send(command, answer)`` writes one line and waits for its answer."""

    def __init__(self, cmd, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def stderr(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def expect(self, answer, timeout=WRITER_TIMEOUT):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the writer did not answer {answer!r} within {timeout}s\n{self.stderr()}") from None
        assert line == answer, f"the writer answered {line!r}, expected {answer!r}\n{self.stderr()}"

    def send(self, command, answer):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.expect(answer)

    def close(self):
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=CMD_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=CMD_TIMEOUT)
        finally:
            self.log.close()


@contextlib.contextmanager
def writer_process(cmd, log_path, ready):
    w = Writer(cmd, log_path)
    try:
        w.expect(ready)
        yield w
    finally:
        w.close()


@contextlib.contextmanager
def deepspeed_writer(tmp_path):
    """(writer, save dir, reference dir): the host's torch 1.13 writing DeepSpeed tags."""
    save, ref = tmp_path / "save", tmp_path / "ref"
    with writer_process([sys.executable, WRITER, "deepspeed", save, ref], tmp_path / "writer.log",
                        "ok ready deepspeed") as w:
        yield w, str(save), str(ref)


def commit(w, tag):
    """A whole DeepSpeed save: the tag's files, then `latest`."""
    w.send(f"write {tag}", f"ok files {tag}")
    w.send(f"latest {tag}", f"ok latest {tag}")


# ---------------------------------------------------------------------------------------------------
# references and reads

def canon(tensors):
    """{name: (dtype, shape, bytes)}: what a safetensors file holds, its order aside (each view's order is
    checked elsewhere, test_mount.py)."""
    return {k: (str(t.dtype), tuple(t.shape), H.tensor_bytes(t)) for k, t in tensors.items()}


class Refs:
    """Per tag the canonical tensors its model.safetensors and fp32/model.safetensors must hold, from the
    writer's reference files."""

    def __init__(self, ref_dir):
        self.ref_dir = ref_dir
        self.by_view = {"model.safetensors": {}, "fp32/model.safetensors": {}}

    def load(self, tag):
        d = os.path.join(self.ref_dir, tag)
        self.by_view["model.safetensors"][tag] = canon(H.load_expected(os.path.join(d, "model.pt")))
        self.by_view["fp32/model.safetensors"][tag] = canon(H.load_expected(os.path.join(d, "fp32.pt")))

    def which(self, view, data, tags):
        """The tag among `tags` whose reference the bytes of `view` are, or a description of what they are."""
        try:
            got = canon(H.parse_safetensors(data, view))
        except AssertionError as e:
            return None, f"not a valid safetensors file ({len(data)} bytes): {e}"
        for t in tags:
            if self.by_view[view].get(t) == got:
                return t, None
        return None, f"{len(data)} bytes, the reference of none of {sorted(tags)}"

    def check(self, view, data, tag):
        """Asserts that the bytes of `view` are `tag`'s reference, naming the tensors that differ."""
        want = self.by_view[view][tag]
        got = canon(H.parse_safetensors(data, view))
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            other = self.which(view, data, [t for t in self.by_view[view] if t != tag])[0]
            raise AssertionError(f"{view}: not {tag}'s reference; tensors that differ: {diff[:8]}"
                                 + (f" (it is {other}'s)" if other else ""))


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def read_fd(fd, offset=0):
    out = bytearray()
    size = os.fstat(fd).st_size
    while offset + len(out) < size:
        chunk = os.pread(fd, size - offset - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def mount_info(mnt):
    with open(os.path.join(mnt, "ckptfs.json")) as f:
        return json.load(f)


def listed(mnt):
    return set(os.listdir(os.path.join(mnt, "tags")))


def json_tags(info):
    return {t["name"] for t in info["tags"]}


def poll(predicate, what, timeout=POLL_TIMEOUT, mnt=None):
    """Calls predicate() until it is true (an OSError or AssertionError counts as not yet: a poll that catches
    the tree mid-change keeps polling; the reader threads are what asserts that no read fails); returns the
    seconds it took. A failure names the last error and, given `mnt`, what the mount says it serves."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return time.monotonic() - t0
        except (OSError, AssertionError) as e:
            last = e
        time.sleep(0.05)
    raise AssertionError(f"{what}: not seen within {timeout}s" + (f" (last: {last!r})" if last else "")
                         + (f"; the mount: {mount_state(mnt)}" if mnt else ""))


def mount_state(mnt):
    """What the mount serves, in short: tags/, and ckptfs.json's root_tag, latest, tags, in_progress, live."""
    try:
        info = mount_info(mnt)
        return (f"tags/ {sorted(listed(mnt))}; ckptfs.json root_tag {info['root_tag']}, latest {info['latest']}, "
                f"tags {sorted(json_tags(info))}, in_progress {info.get('in_progress')}, live {info.get('live')}")
    except (OSError, ValueError) as e:
        return repr(e)


def assert_not_served(mnt, tag, why, window=ABSENT_WINDOW, in_progress=False):
    """For `window` seconds: `tag` is not listed under tags/, not in ckptfs.json's tags nor its root_tag, and
    tags/<tag> (and its model.safetensors) is ENOENT. With `in_progress`, first waits until ckptfs.json lists
    it under "in_progress" (the mount has seen the save and holds it back; docs/mount.md, Live runs), and it
    stays listed there."""
    if in_progress:
        poll(lambda: tag in mount_info(mnt).get("in_progress", []), f"{why}: {tag} in ckptfs.json's in_progress", mnt=mnt)
    deadline = time.monotonic() + window
    while True:
        names = listed(mnt)
        assert tag not in names, f"{why}: {tag} is listed under tags/ ({sorted(names)})"
        info = mount_info(mnt)
        assert tag not in json_tags(info), f"{why}: {tag} is in ckptfs.json's tags"
        assert info["root_tag"] != tag, f"{why}: ckptfs.json's root_tag is {tag}"
        if in_progress:
            assert tag in info.get("in_progress", []), f"{why}: {tag} left ckptfs.json's in_progress: {info}"
        for p in (os.path.join(mnt, "tags", tag), os.path.join(mnt, "tags", tag, "model.safetensors")):
            with pytest.raises(FileNotFoundError):
                os.stat(p)
        with pytest.raises(FileNotFoundError):
            open(os.path.join(mnt, "tags", tag, "model.safetensors"), "rb")
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def root_serves(mnt, refs, tag):
    """The root is `tag`'s: ckptfs.json's root_tag and both root files read now."""
    if mount_info(mnt)["root_tag"] != tag or tag not in listed(mnt):
        return False
    return all(refs.which(v, read_file(os.path.join(mnt, v)), [tag])[0] == tag
               for v in ("model.safetensors", "fp32/model.safetensors"))


# ---------------------------------------------------------------------------------------------------
# readers

class Readers:
    """Threads that read the mount without pause and record every read that is not what it must be.
    `committed`: the tags `latest` has named so far, in order (the test adds a tag before it writes `latest`)."""

    MAX_ERRORS = 40

    def __init__(self, mnt, refs, committed):
        self.mnt, self.refs, self.committed = mnt, refs, committed
        self.stop = threading.Event()
        self.errors, self.error_count = collections.Counter(), 0  # distinct bad reads -> how many
        self.lock = threading.Lock()
        self.seen = collections.Counter()  # (reader, tag) -> reads
        self.reads = collections.Counter()
        self.threads = [threading.Thread(target=self._guard, args=(f, name), daemon=True) for f, name in (
            (lambda st: self._root("model.safetensors", st), "root model.safetensors #1"),
            (lambda st: self._root("model.safetensors", st), "root model.safetensors #2"),
            (lambda st: self._root("fp32/model.safetensors", st), "root fp32/model.safetensors"),
            (self._tags, "tags/ and ckptfs.json"))]

    def error(self, msg):
        with self.lock:
            self.error_count += 1
            if msg in self.errors or len(self.errors) < self.MAX_ERRORS:
                self.errors[msg] += 1

    def _guard(self, work, name):
        """Runs one round of `work` after another until stopped; whatever a round raises is a bad read (a
        ckptfs.json that does not parse, a file that is not safetensors)."""
        state = {}
        while not self.stop.is_set():
            try:
                work(state)
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.error(f"{name}: {e!r}")

    def _root(self, view, state):
        """One open, read, close of the root's `view`: a committed tag's reference, never older than the
        newest this thread read before (`state`)."""
        name = f"root {view}"
        data = read_file(os.path.join(self.mnt, view))
        tags = list(self.committed)  # taken after the read: every tag that may be at the root by now
        tag, what = self.refs.which(view, data, tags)
        self.reads[view] += 1
        if tag is None:
            self.error(f"{name}: {what}")
            return
        self.seen[(view, tag)] += 1
        i, newest = tags.index(tag), state.get("newest", -1)
        if i < newest:
            self.error(f"{name}: went back from {tags[newest]} to {tag}")
        state["newest"] = max(newest, i)

    def _tags(self, state):
        """One listing of tags/ and ckptfs.json, and a read of every listed tag's model.safetensors: only
        committed tags, each its own reference."""
        view = "model.safetensors"
        names = listed(self.mnt)
        committed = set(self.committed)
        if names - committed:
            self.error(f"tags/ lists {sorted(names - committed)} before `latest` named it")
        info = mount_info(self.mnt)
        committed = set(self.committed)
        if json_tags(info) - committed or info["root_tag"] not in committed:
            self.error(f"ckptfs.json lists {sorted(json_tags(info))}, root_tag {info['root_tag']}, with only "
                       f"{sorted(committed)} named by `latest`")
        for t in sorted(names & committed):
            data = read_file(os.path.join(self.mnt, "tags", t, view))
            self.reads["tags"] += 1
            if self.refs.which(view, data, [t])[0] != t:
                self.error(f"tags/{t}/{view}: {self.refs.which(view, data, list(committed))[1]}")

    def report(self):
        return f"{self.error_count} bad reads:\n" + "\n".join(f"{n} x {m}" for m, n in self.errors.items())

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=CMD_TIMEOUT)
        if self.error_count:  # shown with the failure of the test, whatever failed first
            print(self.report())
        assert not any(t.is_alive() for t in self.threads), "a reader hung"


# ---------------------------------------------------------------------------------------------------
# DeepSpeed

def test_deepspeed_tags_appear_as_latest_names_them(ckptfs_bin, tmp_path):
    with deepspeed_writer(tmp_path) as (w, save, ref):
        refs = Refs(ref)
        commit(w, step_tag(1))
        refs.load(step_tag(1))
        committed = [step_tag(1)]
        with mount(ckptfs_bin, save, tmp_path / "mnt") as mnt:
            assert listed(mnt) == {step_tag(1)}
            assert root_serves(mnt, refs, step_tag(1)), "the root is not global_step1's reference at the mount"
            latencies = {}
            with Readers(mnt, refs, committed) as readers:
                for i in (2, 3, 4):
                    tag = step_tag(i)
                    w.send(f"write {tag} pause", f"ok paused {tag}")  # one rank file and half of another
                    assert_not_served(mnt, tag, "a tag half written", in_progress=True)
                    w.send("resume", f"ok files {tag}")
                    refs.load(tag)
                    assert_not_served(mnt, tag, "a tag written but not named by `latest`", in_progress=True)
                    committed.append(tag)  # before `latest`: from now on a read may be of it
                    w.send(f"latest {tag}", f"ok latest {tag}")
                    latencies[tag] = poll(lambda: root_serves(mnt, refs, tag),
                                          f"{tag} listed and served at the root after `latest` named it", mnt=mnt)
                    for v in ("model.safetensors", "fp32/model.safetensors"):
                        refs.check(v, read_file(os.path.join(mnt, "tags", tag, v)), tag)
                    assert listed(mnt) == set(committed)
                    info = mount_info(mnt)
                    assert json_tags(info) == set(committed) and info["latest"] == tag, info
                    assert tag not in info.get("in_progress", []), info
                    # let the readers read this tag a while, as they read the ones before
                    poll(lambda: readers.seen[("model.safetensors", tag)] >= 3, f"readers reading {tag}")
            assert readers.error_count == 0, readers.report()
            for v in ("model.safetensors", "fp32/model.safetensors"):
                assert {t for (view, t) in readers.seen if view == v} >= set(committed[1:]), \
                    f"the readers of {v} did not see every tag: {dict(readers.seen)}"
            assert readers.reads["tags"] > 0, dict(readers.reads)
            # every tag is still what it was
            for t in committed:
                refs.check("model.safetensors", read_file(os.path.join(mnt, "tags", t, "model.safetensors")), t)
        print(f"latency from `latest` to the root serving the tag: {latencies}")


def test_deleted_tag_disappears_and_its_open_files_never_read_wrong_bytes(ckptfs_bin, tmp_path):
    with deepspeed_writer(tmp_path) as (w, save, ref):
        refs = Refs(ref)
        for i in (1, 2, 3):
            commit(w, step_tag(i))
            refs.load(step_tag(i))
        old = step_tag(1)
        with mount(ckptfs_bin, save, tmp_path / "mnt") as mnt:
            assert listed(mnt) == {step_tag(i) for i in (1, 2, 3)}
            views = ("model.safetensors", "fp32/model.safetensors")
            held = {v: os.open(os.path.join(mnt, "tags", old, v), os.O_RDONLY) for v in views}  # not read yet
            try:
                shutil.rmtree(os.path.join(save, old))  # a run keeping its last N checkpoints
                poll(lambda: old not in listed(mnt) and old not in json_tags(mount_info(mnt)),
                     f"{old} gone from tags/ and ckptfs.json after rm -rf", mnt=mnt)
                assert_not_served(mnt, old, "a deleted tag", window=0)
                for v, fd in held.items():
                    try:
                        data = read_fd(fd)
                    except OSError as e:
                        assert e.errno == errno.EIO, f"tags/{old}/{v} opened before the deletion: {e!r}, not EIO"
                    else:
                        refs.check(v, data, old)
            finally:
                for fd in held.values():
                    os.close(fd)
            assert listed(mnt) == {step_tag(2), step_tag(3)}
            assert root_serves(mnt, refs, step_tag(3))
            refs.check("model.safetensors", read_file(os.path.join(mnt, "tags", step_tag(2), "model.safetensors")),
                       step_tag(2))
            # the run goes on after the deletion
            commit(w, step_tag(4))
            refs.load(step_tag(4))
            poll(lambda: root_serves(mnt, refs, step_tag(4)), f"{step_tag(4)} at the root after the deletion", mnt=mnt)
            assert listed(mnt) == {step_tag(i) for i in (2, 3, 4)}


def test_open_files_keep_the_tag_they_were_opened_on(ckptfs_bin, tmp_path):
    with deepspeed_writer(tmp_path) as (w, save, ref):
        refs = Refs(ref)
        old, new = step_tag(1), step_tag(2)
        commit(w, old)
        refs.load(old)
        with mount(ckptfs_bin, save, tmp_path / "mnt") as mnt:
            model, fp32 = os.path.join(mnt, "model.safetensors"), os.path.join(mnt, "fp32/model.safetensors")
            fd_model = os.open(model, os.O_RDONLY)
            fd_fp32 = os.open(fp32, os.O_RDONLY)
            try:
                head = os.pread(fd_model, 4096, 0)  # partly read before the switch (the page cache holds it)
                assert len(head) == 4096
                commit(w, new)
                refs.load(new)
                poll(lambda: mount_info(mnt)["root_tag"] == new, f"ckptfs.json's root_tag {new}", mnt=mnt)
                # a new open sees the new tag at once (the lookup and the page cache are the new tree's)
                refs.check("model.safetensors", read_file(model), new)
                refs.check("fp32/model.safetensors", read_file(fp32), new)
                # the files opened before read the old tag, to the end and again from the start
                refs.check("model.safetensors", head + read_fd(fd_model, 4096), old)
                refs.check("model.safetensors", read_fd(fd_model), old)
                refs.check("fp32/model.safetensors", read_fd(fd_fp32), old)
                # and the new one again, the old files still open
                refs.check("model.safetensors", read_file(model), new)
            finally:
                os.close(fd_model)
                os.close(fd_fp32)
            refs.check("model.safetensors", read_file(os.path.join(mnt, "tags", old, "model.safetensors")), old)


def test_static_mount_never_follows(ckptfs_bin, tmp_path):
    with deepspeed_writer(tmp_path) as (w, save, ref):
        refs = Refs(ref)
        old, new = step_tag(1), step_tag(2)
        commit(w, old)
        refs.load(old)
        with mount(ckptfs_bin, save, tmp_path / "static", "-o", "static") as static, \
                mount(ckptfs_bin, save, tmp_path / "live") as live:
            assert root_serves(static, refs, old) and root_serves(live, refs, old)
            assert "live" not in mount_info(static) and mount_info(live)["live"]["following"] is True
            commit(w, new)
            refs.load(new)
            poll(lambda: root_serves(live, refs, new), f"{new} on the live mount (the control)", mnt=live)
            deadline = time.monotonic() + ABSENT_WINDOW
            while True:
                assert listed(static) == {old}, "the -o static mount lists a tag saved after it was mounted"
                info = mount_info(static)
                assert json_tags(info) == {old} and info["root_tag"] == old, info
                assert root_serves(static, refs, old)
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            with pytest.raises(FileNotFoundError):
                os.stat(os.path.join(static, "tags", new))


# ---------------------------------------------------------------------------------------------------
# PyTorch DCP (torch 2.6 in the Debian 13 chroot)

def dcp_chroot():
    """The chroot with torch 2.6, or None: ${CKPTFS_CHROOT} if set, else build/trixie, else what .ci/run makes."""
    if os.environ.get("CKPTFS_CHROOT"):
        candidates = [RG.default_chroot()]
    else:
        candidates = [os.path.join(H.REPO, "build", "trixie"), "/var/cache/ckptfs/trixie"]
    return next((c for c in candidates if RG.chroot_ready(c)), None)


@contextlib.contextmanager
def dcp_writer(tmp_path):
    """(writer, save dir, reference dir) with the writer in the chroot; the dirs are the host's paths."""
    chroot = dcp_chroot()
    if chroot is None:
        pytest.skip("no Debian 13 chroot with torch 2.6 for the DCP writer (CKPTFS_CHROOT, build/trixie or "
                    "/var/cache/ckptfs/trixie with .ckptfs-chroot-complete): run `CKPTFS_CHROOT=/var/cache/ckptfs/"
                    "trixie bash mount_tests/modern/setup_chroot.sh`")
    name = f"ckptfs-live-run-{os.getpid()}-{tmp_path.name}"
    host = os.path.join(chroot, "tmp", name)
    shutil.rmtree(host, ignore_errors=True)
    os.makedirs(os.path.join(host, "tmp"))
    try:
        shutil.copy(WRITER, host)
        cmd = RG.in_chroot_cmd(chroot, "python3", f"/tmp/{name}/live_writer.py", "dcp", f"/tmp/{name}/save",
                               f"/tmp/{name}/ref", tmpdir=f"/tmp/{name}/tmp")
        with writer_process(cmd, tmp_path / "writer.log", "ok ready dcp") as w:
            yield w, os.path.join(host, "save"), os.path.join(host, "ref")
    finally:
        shutil.rmtree(host, ignore_errors=True)


def test_dcp_step_dirs_appear_once_their_metadata_is_written(ckptfs_bin, tmp_path):
    with dcp_writer(tmp_path) as (w, save, ref):
        def reference(step):
            return read_file(os.path.join(ref, step, "model.safetensors"))

        def serves(mnt, step):
            return (mount_info(mnt)["root_tag"] == step and step in listed(mnt)
                    and read_file(os.path.join(mnt, "model.safetensors")) == reference(step))

        w.send("save 1", "ok saved step-1")
        with mount(ckptfs_bin, save, tmp_path / "mnt") as mnt:
            assert listed(mnt) == {"step-1"}
            assert serves(mnt, "step-1"), "the root is not step-1's model at the mount"
            for i in (2, 3):
                step = f"step-{i}"
                w.send(f"save {i} pause", f"ok paused {step}")
                files = set(os.listdir(os.path.join(save, step)))
                assert ".metadata" not in files and any(f.endswith(".distcp") for f in files), files
                assert_not_served(mnt, step, "a DCP step dir without its .metadata", in_progress=True)
                assert serves(mnt, f"step-{i - 1}")
                w.send("resume", f"ok saved {step}")
                poll(lambda: serves(mnt, step), f"{step} listed and served at the root once .metadata is written",
                     mnt=mnt)
                assert read_file(os.path.join(mnt, "tags", step, "model.safetensors")) == reference(step)
                # fp32/: the same tensors, 16-bit floats widened (exactly)
                fp32 = H.read_safetensors(os.path.join(mnt, "tags", step, "fp32", "model.safetensors"))
                want = {k: (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t)
                        for k, t in H.load_expected(os.path.join(ref, step, "model.pt")).items()}
                H.assert_state_equal(fp32, want, False, f"tags/{step}/fp32/model.safetensors")
            assert listed(mnt) == {"step-1", "step-2", "step-3"}
            assert json_tags(mount_info(mnt)) == {"step-1", "step-2", "step-3"}
            for step in ("step-1", "step-2"):
                assert read_file(os.path.join(mnt, "tags", step, "model.safetensors")) == reference(step)


# ---------------------------------------------------------------------------------------------------
# s3:// sources: -o refresh=SECONDS

S3_BUCKET = "ckptfs-live-run"
S3_REFRESH = 1  # seconds between listings
S3_ABSENT_WINDOW = 2.5 * S3_REFRESH  # two listings and more


def test_s3_source_follows_at_the_refresh_interval(s3_gateway, ckptfs_bin, tmp_path, monkeypatch):  # noqa: F811
    """The tests' gateway (radosgw 20.2's POSIX driver) lists a key PUT or DELETEd after its first listing of
    the bucket twice until it restarts: once out of order at the head of the listing, once in place with a
    garbage size and a 1970 date (ckptfs rightly refuses such a listing: "the store lists this key twice",
    and keeps serving what it served). So after each change to the store the gateway is restarted: the
    mount's refreshes in between fail (connection refused, or that listing) and the next one sees the store
    as it is."""
    gateway = s3_gateway
    for k, v in gateway.env().items():
        monkeypatch.setenv(k, v)  # the mount inherits them
    gateway.make_bucket(S3_BUCKET)
    prefix = f"run-{tmp_path.name}"

    def keys_of(save, tag):
        return [f"{prefix}/{tag}/{name}" for name in sorted(os.listdir(os.path.join(save, tag)))]

    with deepspeed_writer(tmp_path) as (w, save, ref):
        refs = Refs(ref)
        commit(w, step_tag(1))
        refs.load(step_tag(1))
        gateway.upload_tree(save, S3_BUCKET, prefix)
        gateway.restart()
        with mount(ckptfs_bin, f"s3://{S3_BUCKET}/{prefix}", tmp_path / "mnt", "-o", f"refresh={S3_REFRESH}") as mnt:
            assert listed(mnt) == {step_tag(1)}
            assert root_serves(mnt, refs, step_tag(1))
            assert mount_info(mnt)["live"]["following"] is True
            for i in (2, 3):
                tag = step_tag(i)
                w.send(f"write {tag}", f"ok files {tag}")
                refs.load(tag)
                gateway.upload_tree(os.path.join(save, tag), S3_BUCKET, f"{prefix}/{tag}")
                gateway.restart()
                assert_not_served(mnt, tag, "a tag whose objects are uploaded, `latest` not yet", S3_ABSENT_WINDOW,
                                  in_progress=True)
                assert root_serves(mnt, refs, step_tag(i - 1))
                w.send(f"latest {tag}", f"ok latest {tag}")
                gateway.put_file(S3_BUCKET, f"{prefix}/latest", os.path.join(save, "latest"))
                gateway.restart()
                poll(lambda: root_serves(mnt, refs, tag), f"{tag} served at the root after the `latest` object named it",
                     mnt=mnt)
                refs.check("model.safetensors", read_file(os.path.join(mnt, "tags", tag, "model.safetensors")), tag)
            assert listed(mnt) == {step_tag(i) for i in (1, 2, 3)}
            for key in keys_of(save, step_tag(1)):
                gateway.delete(S3_BUCKET, key)
            gateway.restart()
            poll(lambda: step_tag(1) not in listed(mnt), f"{step_tag(1)} gone after its objects were deleted", mnt=mnt)
            assert listed(mnt) == {step_tag(2), step_tag(3)}
            assert root_serves(mnt, refs, step_tag(3))
