"""Helpers for test_permissions.py: checkpoint copies in a folder every user can reach, owners and modes set
on them, client commands run as another user (runuser), and the owner, group and mode each node of a mount
should show, worked out from the source files' own stat (docs/mount.md#permissions), never from ckptfs.

The rules (issue 30): a file made of sources shows the owner and group they share (else SRC's) and the read
bits every source grants, each masked by the search bits of the directories between / and that source (a
class without x on one of them loses r); a directory shows the read bits of the source directory it stands
for (the root and tags/: SRC; tags/<tag>/ and below: the tag's dir; other root-level dirs: the latest tag's
dir), masked by the directories above it, with x wherever r; ckptfs.json (ckptfs-stats.json) SRC's read bits;
a file made of no source (universal/latest_universal) its directory's owner, group and read bits.
"""
import contextlib
import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from mounting import CMD_TIMEOUT, server_pids, unmount, wait_until

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "deepspeed-zero3-bf16"
# Environment of the commands run as another user: none of root's (XDG_CACHE_HOME is a folder of root's).
USER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
# the views of the example (a ZeRO-3 bf16 save: no universal/ files are compared byte for byte here)
VIEWS = ["model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors"]
SIDE_FILES = ["config.json", "tokenizer.json"]
META_FILES = {"ckptfs.json", "ckptfs-stats.json"}
# Files made of no source: universal/latest_universal holds the name of the universal dir beside it (what
# listing that dir shows anyway); such a file takes its directory's owner, group and read bits.
SOURCELESS = {"latest_universal"}
CLASSES = [(stat.S_IRUSR, stat.S_IXUSR), (stat.S_IRGRP, stat.S_IXGRP), (stat.S_IROTH, stat.S_IXOTH)]


# ----------------------------------------------------------------------------------------------------
# folders and copies

@contextlib.contextmanager
def open_tmpdir():
    """A fresh folder under /tmp that every user can traverse and list (0755; pytest's tmp_path lies below
    /tmp/pytest-of-root, 0700, which nobody else passes); removed afterwards, once nothing below it is
    mounted."""
    d = Path(tempfile.mkdtemp(prefix="ckptfs-perm-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        with open("/proc/self/mountinfo") as f:
            below = sorted((line.split()[4] for line in f if line.split()[4].startswith(f"{d}/")), reverse=True)
        for m in below:
            unmount(m)
            wait_until(lambda: not server_pids(m))
        shutil.rmtree(d, ignore_errors=True)


def copy_example(dst):
    """A copy of the bundled example checkpoint at `dst` (dirs 0755, files 0644, root's, as in the repo)."""
    shutil.copytree(EXAMPLE, dst)
    set_tree(dst, 0o755, 0o644, 0, 0)
    return Path(dst)


def set_tree(root, dir_mode=None, file_mode=None, uid=None, gid=None):
    """chmod/chown every directory (`root` included) and file below `root`."""
    root = Path(root)
    for d, dirs, files in os.walk(root):
        for p, mode in [(Path(d), dir_mode)] + [(Path(d) / f, file_mode) for f in files]:
            if uid is not None or gid is not None:
                os.chown(p, -1 if uid is None else uid, -1 if gid is None else gid)
            if mode is not None:
                os.chmod(p, mode)


def mount_point(parent, owner=None):
    """`parent`/mnt, created 0755 (owned by `owner`, a uid, when given)."""
    mnt = Path(parent) / "mnt"
    mnt.mkdir(mode=0o755)
    os.chmod(mnt, 0o755)
    if owner is not None:
        os.chown(mnt, owner, -1)
    return mnt


# ----------------------------------------------------------------------------------------------------
# running as another user

def as_user(user, *args, timeout=CMD_TIMEOUT):
    """Runs `runuser -u USER -- ARGS` (USER's uid, primary and supplementary groups, a clean environment):
    CompletedProcess with stdout as bytes and stderr as text."""
    cmd = ["runuser", "-u", user, "--", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=USER_ENV, stdin=subprocess.DEVNULL)
    r.stderr = r.stderr.decode(errors="replace")
    r.command = " ".join(cmd)
    return r


def shown(r):
    """The command and what it answered, as a shell session shows it."""
    out = r.stdout.decode(errors="replace") if isinstance(r.stdout, bytes) else r.stdout
    if len(out) > 300:
        out = out[:300] + f"... ({len(r.stdout)} bytes)"
    return f"$ {r.command}\n{out}{r.stderr}(exit {r.returncode})"


def assert_denied(r):
    """The command failed with EACCES: 'Permission denied' on stderr, nothing on stdout."""
    assert r.returncode != 0 and "Permission denied" in r.stderr and not r.stdout, \
        f"expected Permission denied:\n{shown(r)}"


def assert_reads(r, want):
    """The command succeeded and printed `want` (bytes)."""
    assert r.returncode == 0, f"expected a read:\n{shown(r)}"
    assert r.stdout == want, f"{r.command}: {len(r.stdout)} bytes differ from the {len(want)} expected"


def uid_of(user):
    return pwd.getpwnam(user).pw_uid


def gid_of(group):
    return grp.getgrnam(group).gr_gid


@contextlib.contextmanager
def temporary_users(group, member):
    """Creates group `group` and user `member` (its own primary group, `group` as a supplementary one, no
    home); removes both afterwards (and any left by an interrupted run, first)."""
    def remove():
        for user in (member,):
            with contextlib.suppress(KeyError):
                pwd.getpwnam(user)
                subprocess.run(["userdel", user], capture_output=True, timeout=CMD_TIMEOUT)
        for g in (member, group):
            with contextlib.suppress(KeyError):
                grp.getgrnam(g)
                subprocess.run(["groupdel", g], capture_output=True, timeout=CMD_TIMEOUT)
    remove()
    try:
        for cmd in (["groupadd", group],
                    ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                     "--user-group", "--groups", group, member]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT)
            assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
        yield
    finally:
        remove()


# ----------------------------------------------------------------------------------------------------
# what the sources say

def search_mask(path):
    """The read bits (0444 at most) of the classes that have x on every directory from / down to `path`'s
    parent, both along the path as spelt and along the one its symlinks resolve to: on disk, a class without
    it cannot reach `path`'s bytes."""
    mask = 0o444
    for p in {Path(os.path.abspath(path)), Path(os.path.realpath(path))}:
        for d in reversed(p.parents):  # "/", ..., the parent
            mode = os.stat(d).st_mode
            for r, x in CLASSES:
                if not mode & x:
                    mask &= ~r
    return mask


def file_access(sources, src):
    """(uid, gid, mode) of a file made of `sources`: the owner and group they share (else SRC's), the read
    bits all of them grant each reachable from /."""
    sts = [os.stat(s) for s in sources]
    st_src = os.stat(src)
    uids, gids = {s.st_uid for s in sts}, {s.st_gid for s in sts}
    mode = 0o444
    for s, st in zip(sources, sts):
        mode &= st.st_mode & search_mask(s)
    return (uids.pop() if len(uids) == 1 else st_src.st_uid, gids.pop() if len(gids) == 1 else st_src.st_gid,
            mode)


def dir_access(d):
    """(uid, gid, mode) of a mount directory standing for source directory `d`: its read bits reachable
    from /, with x wherever r."""
    st = os.stat(d)
    r = st.st_mode & 0o444 & search_mask(d)
    return st.st_uid, st.st_gid, r | (r >> 2)


def meta_access(src):
    """ckptfs.json (and ckptfs-stats.json): as SRC's directory, read bits only."""
    uid, gid, mode = dir_access(src)
    return uid, gid, mode & 0o444


def latest_tag_dir(src):
    return Path(src) / (Path(src) / "latest").read_text().strip()


def tag_files(tag_dir):
    """Every file of a tag dir: what the views of the tag are made of (the example's views read its
    model-state and optimizer files)."""
    return sorted(p for p in Path(tag_dir).rglob("*") if p.is_file())


def expected_node(rel, is_dir, src):
    """(uid, gid, mode) of the mount's node at `rel` (relative to the mount; "." the root) for SRC `src`, by
    the rules in this module's docstring. A file that is not a side file nor ckptfs.json counts as made of
    every file of its tag dir, right for the trees of these tests, whose tag files share owner and mode."""
    src = Path(src)
    parts = Path(rel).parts
    if is_dir:
        if rel == "." or parts == ("tags",):
            return dir_access(src)
        if parts[0] == "tags":
            return dir_access(src / parts[1])
        return dir_access(latest_tag_dir(src))
    if len(parts) == 1 and parts[0] in META_FILES:
        return meta_access(src)
    if parts[-1] in SOURCELESS:
        uid, gid, mode = expected_node(str(Path(rel).parent), True, src)
        return uid, gid, mode & 0o444
    if len(parts) == 1 and (src / parts[0]).is_file():
        return file_access([src / parts[0]], src)
    tag_dir = src / parts[1] if parts[0] == "tags" else latest_tag_dir(src)
    return file_access(tag_files(tag_dir), src)


def walk_mount(mnt):
    """[(path relative to the mount, is_dir, os.stat result)] of every node of a mount, the root first
    (walked by the caller's uid: root passes every mode)."""
    nodes = [(".", True, os.stat(mnt))]
    for d, dirs, files in os.walk(mnt):
        for name in dirs:
            p = os.path.join(d, name)
            nodes.append((os.path.relpath(p, mnt), True, os.stat(p)))
        for name in files:
            p = os.path.join(d, name)
            nodes.append((os.path.relpath(p, mnt), False, os.stat(p)))
    return nodes


def access_mismatches(mnt, src, expected=None):
    """The nodes of the mount whose (uid, gid, mode & 0777) differ from `expected(rel, is_dir)` (default: the
    rules from the sources' stat), as readable lines; also checks each node's file type."""
    expected = expected or (lambda rel, is_dir: expected_node(rel, is_dir, src))
    bad = []
    for rel, is_dir, st in walk_mount(mnt):
        assert stat.S_ISDIR(st.st_mode) == is_dir and (is_dir or stat.S_ISREG(st.st_mode)), rel
        got = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
        want = expected(rel, is_dir)
        if got != want:
            bad.append(f"{rel}{'/' if is_dir else ''}: uid {got[0]} gid {got[1]} mode {got[2]:04o}, "
                       f"expected uid {want[0]} gid {want[1]} mode {want[2]:04o}")
    return bad


def super_options(mnt):
    """The options the kernel holds for the FUSE mount at `mnt` (/proc/self/mountinfo, after the " - ")."""
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mnt:
                return set(fields[fields.index("-") + 3].split(","))
    raise AssertionError(f"{mnt} is not mounted")


def root_reads(path):
    with open(path, "rb") as f:
        return f.read()


@contextlib.contextmanager
def dev_fuse_open_to_users():
    """/dev/fuse as Debian's udev rule leaves it (0666) for the block: some containers make it 0600, and libfuse
    opens the device itself (falling back to fusermount3 only when mount(2) says EPERM, not when the open
    fails), so there no user could mount anything. Restored afterwards."""
    before = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    os.chmod("/dev/fuse", 0o666)
    try:
        yield
    finally:
        os.chmod("/dev/fuse", before)
