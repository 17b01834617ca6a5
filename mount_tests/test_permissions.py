"""The mount gives no one more than the sources do (issue 30, docs/mount.md#permissions): every node's owner,
group and mode come from the source files and directories it is made of, and the kernel checks them
(default_permissions is always on), so a user who cannot read a checkpoint on disk cannot read it through a
mount either, with or without allow_other; `-o uid=,gid=,umask=` replace them with the operator's own policy.

Each test copies the bundled example (examples/deepspeed-zero3-bf16) into a folder under /tmp that every user
can traverse, sets owners and modes there, mounts it as root with allow_other (or as a user of its own) and
reads through the mount as real other users (`runuser -u nobody -- cat ...`): the bytes where the sources
allow it (side files equal to the source files, views equal to what root reads through the same mount),
"Permission denied" where they do not. The owner, group and mode every node should show are worked out from
the source files' stat (permissions_helpers.py), never taken from ckptfs. Needs root (users, chown, runuser).
"""
import os
import pwd
import shutil
import stat
from pathlib import Path

import pytest

import helpers as H
import permissions_helpers as P
from mounting import foreground, is_mounted, mounted, run_ckptfs, server_pids, unmount, wait_until

GROUP = "ckptfsperm"          # created for the module: a group ...
MEMBER = "ckptfspermuser"     # ... and a user in it (its own primary group besides)
OTHER = "nobody"              # a user in neither
TAG = "global_step3"          # the example's only tag

pytestmark = [
    pytest.mark.xdist_group("permissions"),  # the test users and groups are made and removed per module
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: test users, chown, runuser, allow_other mounts"),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("runuser", "useradd", "groupadd", "fusermount3")),
                       reason="needs runuser, useradd, groupadd and fusermount3"),
]


@pytest.fixture(scope="module")
def users():
    """The test group and its member, created for this module and removed after it."""
    with P.temporary_users(GROUP, MEMBER):
        member = pwd.getpwnam(MEMBER)
        assert P.gid_of(GROUP) in os.getgrouplist(MEMBER, member.pw_gid)
        yield member


@pytest.fixture
def tmp():
    """A folder under /tmp every user can traverse (removed, with what is mounted below it, afterwards)."""
    with P.open_tmpdir() as d:
        yield d


def assert_access_as_sources_say(mnt, src):
    bad = P.access_mismatches(mnt, src)
    assert not bad, "owner, group or mode not as the sources give them:\n" + "\n".join(bad)


def nobody_reads(mnt, names, refs):
    """`nobody` reads each of `names` through the mount: the bytes `refs[name]`."""
    for name in names:
        P.assert_reads(P.as_user(OTHER, "cat", Path(mnt) / name), refs[name])


def nobody_is_refused(mnt, names):
    for name in names:
        P.assert_denied(P.as_user(OTHER, "cat", Path(mnt) / name))


def test_private_source_dir_refuses_other_users(ckptfs_bin, tmp):
    """SRC 0700 root:root, mounted with allow_other: nobody cannot list the mount or read anything in it;
    root (the mounting user) reads it all."""
    src = P.copy_example(tmp / "ckpt")
    os.chmod(src, 0o700)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        assert P.root_reads(mnt / "config.json") == (src / "config.json").read_bytes()
        assert P.root_reads(mnt / "tokenizer.json") == (src / "tokenizer.json").read_bytes()
        H.parse_safetensors(P.root_reads(mnt / "model.safetensors"), "model.safetensors")
        ls = P.as_user(OTHER, "ls", mnt)
        P.assert_denied(ls)
        print(P.shown(ls))
        for name in ("model.safetensors", "ckptfs.json", "config.json", "fp32/pytorch_model.bin",
                     f"tags/{TAG}/model.safetensors"):
            r = P.as_user(OTHER, "cat", mnt / name)
            P.assert_denied(r)
            print(P.shown(r))
        P.assert_denied(P.as_user(OTHER, "stat", mnt / "config.json"))
        # what the sources give: the root 0500 (SRC's r bits for its owner, x with it), config.json 0400
        # (0644 less what SRC's 0700 keeps group and others from reaching), everything root's
        assert P.expected_node(".", True, src) == (0, 0, 0o500)
        assert P.expected_node("config.json", False, src) == (0, 0, 0o400)
        assert_access_as_sources_say(mnt, src)


@pytest.mark.parametrize("options", [[], ["-o", "allow_other"], ["-o", "allow_other,uid=0,umask=022"]])
def test_default_permissions_is_always_on(ckptfs_bin, tmp, options):
    """The kernel checks the modes for every mount (default_permissions), with or without allow_other."""
    src = P.copy_example(tmp / "ckpt")
    with mounted(ckptfs_bin, src, P.mount_point(tmp), *options) as mnt:
        opts = P.super_options(mnt)
        assert "default_permissions" in opts, opts
        assert ("allow_other" in opts) == bool(options), opts


def test_owner_only_files_are_listed_but_not_read(ckptfs_bin, tmp):
    """Every file of the checkpoint 0600, dirs 0755: nobody lists the mount (the same names root sees) and
    reads ckptfs.json (SRC's 0755: r for all), but no view and no side file; they all show 0400."""
    src = P.copy_example(tmp / "ckpt")
    P.set_tree(src, 0o755, 0o600)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        ls = P.as_user(OTHER, "ls", "-a", mnt)
        assert ls.returncode == 0, P.shown(ls)
        assert sorted(ls.stdout.decode().split()) == sorted([".", ".."] + os.listdir(mnt))
        fp32 = P.as_user(OTHER, "ls", mnt / "fp32")
        assert fp32.returncode == 0 and sorted(fp32.stdout.decode().split()) == sorted(os.listdir(mnt / "fp32"))
        nobody_is_refused(mnt, P.VIEWS + P.SIDE_FILES + [f"tags/{TAG}/model.safetensors"])
        nobody_reads(mnt, ["ckptfs.json"], {"ckptfs.json": P.root_reads(mnt / "ckptfs.json")})
        for name in P.VIEWS + P.SIDE_FILES:
            assert stat.S_IMODE(os.stat(mnt / name).st_mode) == 0o400, name
        assert stat.S_IMODE(os.stat(mnt / "ckptfs.json").st_mode) == 0o444
        assert_access_as_sources_say(mnt, src)


def test_group_readable_checkpoint(ckptfs_bin, users, tmp):
    """Files 0640, dirs 0750, group GROUP: a member of GROUP reads the views and side files (root's bytes,
    the source's bytes); nobody, not in it, is refused from the root down."""
    src = P.copy_example(tmp / "ckpt")
    gid = P.gid_of(GROUP)
    P.set_tree(src, 0o750, 0o640, 0, gid)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        refs = {v: P.root_reads(mnt / v) for v in P.VIEWS}
        refs.update({s: (src / s).read_bytes() for s in P.SIDE_FILES})
        for name in P.VIEWS + P.SIDE_FILES:
            P.assert_reads(P.as_user(MEMBER, "cat", mnt / name), refs[name])
        H.parse_safetensors(refs["model.safetensors"], "model.safetensors")
        ls = P.as_user(MEMBER, "ls", mnt)
        assert ls.returncode == 0 and "model.safetensors" in ls.stdout.decode().split(), P.shown(ls)
        P.assert_denied(P.as_user(OTHER, "ls", mnt))
        nobody_is_refused(mnt, ["config.json", "model.safetensors"])
        st = os.stat(mnt / "config.json")
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o440)
        assert_access_as_sources_say(mnt, src)


def test_one_stricter_side_file(ckptfs_bin, tmp):
    """config.json 0600 while the rest is 0644 (dirs 0755): nobody reads the views, tokenizer.json and
    ckptfs.json, not config.json."""
    src = P.copy_example(tmp / "ckpt")
    os.chmod(src / "config.json", 0o600)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        names = P.VIEWS + [f"tags/{TAG}/model.safetensors", "ckptfs.json"]
        refs = {v: P.root_reads(mnt / v) for v in names}
        refs["tokenizer.json"] = (src / "tokenizer.json").read_bytes()
        nobody_reads(mnt, names + ["tokenizer.json"], refs)
        nobody_is_refused(mnt, ["config.json"])
        assert P.root_reads(mnt / "config.json") == (src / "config.json").read_bytes()
        assert stat.S_IMODE(os.stat(mnt / "config.json").st_mode) == 0o400
        assert stat.S_IMODE(os.stat(mnt / "tokenizer.json").st_mode) == 0o444
        assert_access_as_sources_say(mnt, src)


def test_one_stricter_shard_hides_the_views_made_of_it(ckptfs_bin, tmp):
    """One optimizer shard (the fp32 masters every view of a ZeRO-3 save is made of) 0600: every view shows
    0400 (the read bits all its sources grant) and nobody is refused it, while the side files stay
    readable."""
    src = P.copy_example(tmp / "ckpt")
    shard = src / TAG / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    os.chmod(shard, 0o600)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        nobody_is_refused(mnt, P.VIEWS + [f"tags/{TAG}/{v}" for v in P.VIEWS])
        nobody_reads(mnt, P.SIDE_FILES, {s: (src / s).read_bytes() for s in P.SIDE_FILES})
        for v in P.VIEWS:
            assert stat.S_IMODE(os.stat(mnt / v).st_mode) == 0o400, v
        H.parse_safetensors(P.root_reads(mnt / "model.safetensors"), "model.safetensors")  # root still reads


@pytest.mark.parametrize("owners", ["shared", "mixed"])
def test_view_owner_is_the_one_its_sources_share(ckptfs_bin, tmp, owners):
    """The tag's files all daemon's (SRC and the side files root's): the views are daemon's. One optimizer
    shard bin's instead: its sources share no owner, the views take SRC's (nobody's here, to tell it from the
    side files' root)."""
    src = P.copy_example(tmp / "ckpt")
    daemon, binu, nob = pwd.getpwnam("daemon"), pwd.getpwnam("bin"), pwd.getpwnam(OTHER)
    P.set_tree(src / TAG, uid=daemon.pw_uid, gid=daemon.pw_gid)
    os.chown(src, nob.pw_uid, nob.pw_gid)
    if owners == "mixed":
        os.chown(src / TAG / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", binu.pw_uid, binu.pw_gid)
    want = (daemon.pw_uid, daemon.pw_gid) if owners == "shared" else (nob.pw_uid, nob.pw_gid)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        for v in P.VIEWS + [f"tags/{TAG}/{v}" for v in P.VIEWS]:
            st = os.stat(mnt / v)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (*want, 0o444), v
        for s in P.SIDE_FILES:
            st = os.stat(mnt / s)
            assert (st.st_uid, st.st_gid) == (0, 0), s
        st = os.stat(mnt / "fp32")  # a root-level view dir: the latest tag dir's owner
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (daemon.pw_uid, daemon.pw_gid, 0o555)
        st = os.stat(mnt)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (nob.pw_uid, nob.pw_gid, 0o555)


def test_private_tag_dir_hides_its_views_not_the_side_files(ckptfs_bin, tmp):
    """The tag dir 0700 (its files 0644, SRC 0755): on disk only root reaches the shards, so the views and
    the dirs standing for the tag (fp32/, tags/<tag>/) are root's alone; config.json, tokenizer.json and
    ckptfs.json stay readable by nobody."""
    src = P.copy_example(tmp / "ckpt")
    os.chmod(src / TAG, 0o700)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        nobody_is_refused(mnt, P.VIEWS)
        P.assert_denied(P.as_user(OTHER, "ls", mnt / "fp32"))
        P.assert_denied(P.as_user(OTHER, "ls", mnt / "tags" / TAG))
        tags = P.as_user(OTHER, "ls", mnt / "tags")
        assert tags.returncode == 0 and tags.stdout.decode().split() == [TAG], P.shown(tags)
        refs = {s: (src / s).read_bytes() for s in P.SIDE_FILES}
        refs["ckptfs.json"] = P.root_reads(mnt / "ckptfs.json")
        nobody_reads(mnt, P.SIDE_FILES + ["ckptfs.json"], refs)
        assert stat.S_IMODE(os.stat(mnt / "model.safetensors").st_mode) == 0o400
        assert stat.S_IMODE(os.stat(mnt / "fp32").st_mode) == 0o500
        assert_access_as_sources_say(mnt, src)


def test_unreachable_parent_dir_masks_everything(ckptfs_bin, tmp):
    """SRC 0755 with files 0644, but inside a 0700 directory: on disk nobody cannot reach any of it, so
    through the mount nobody cannot either (every node owner-only, masked by the search bits of the
    directories between / and the sources)."""
    outer = tmp / "private"
    outer.mkdir()
    src = P.copy_example(outer / "ckpt")
    os.chmod(outer, 0o700)
    P.assert_denied(P.as_user(OTHER, "cat", src / "config.json"))  # on disk
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        P.assert_denied(P.as_user(OTHER, "ls", mnt))
        nobody_is_refused(mnt, ["config.json", "model.safetensors", "ckptfs.json"])
        assert P.expected_node(".", True, src) == (0, 0, 0o500)
        assert_access_as_sources_say(mnt, src)


@pytest.mark.parametrize("linked", ["config.json", f"{TAG}/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"])
def test_symlinked_source_in_a_private_dir(ckptfs_bin, tmp, linked):
    """A source that is a symlink (0644) to a file in a 0700 directory outside SRC: on disk nobody cannot read
    it through the link, so through the mount nobody cannot read what is made of it either (config.json, or
    every view for the optimizer shard), while the rest stays readable."""
    src = P.copy_example(tmp / "ckpt")
    private = tmp / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    target = private / Path(linked).name
    shutil.move(src / linked, target)
    os.symlink(target, src / linked)
    P.assert_denied(P.as_user(OTHER, "cat", src / linked))  # on disk
    made_of_it = ["config.json"] if linked == "config.json" else P.VIEWS
    readable = P.SIDE_FILES if linked != "config.json" else P.VIEWS + ["tokenizer.json"]
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other") as mnt:
        mnt = Path(mnt)
        refs = {n: P.root_reads(mnt / n) for n in readable}
        nobody_reads(mnt, readable, refs)
        for name in made_of_it:
            st = os.stat(mnt / name)
            want = P.file_access([src / linked], src)[2] if linked == "config.json" else \
                P.file_access(P.tag_files(src / TAG), src)[2]
            assert want == 0o400
            assert stat.S_IMODE(st.st_mode) == want, \
                f"{name}: mode {stat.S_IMODE(st.st_mode):04o}, expected {want:04o} (its source {linked} is a " \
                f"symlink into 0700 {private})"
        nobody_is_refused(mnt, made_of_it)


def user_can_run(user, binary):
    return P.as_user(user, str(binary), "--version").returncode == 0


def test_user_mounts_its_own_checkpoint(ckptfs_bin, users, tmp):
    """A non-root user mounts a checkpoint it owns, without allow_other (fusermount3 mounts it): it reads the
    views (the bytes root reads through a root mount of the same checkpoint) and side files, stat shows its
    uid and group; root, without allow_other, is kept out by FUSE; the user unmounts it."""
    with P.dev_fuse_open_to_users():
        user_mounts_its_own_checkpoint(ckptfs_bin, users, tmp)


def user_mounts_its_own_checkpoint(ckptfs_bin, users, tmp):
    uid, gid = users.pw_uid, users.pw_gid
    src = P.copy_example(tmp / "ckpt")
    P.set_tree(src, uid=uid, gid=gid)
    binary = Path(ckptfs_bin)
    if not user_can_run(MEMBER, binary):  # an ancestor of the build dir closed to others: a copy it can run
        (tmp / "bin").mkdir(mode=0o755)
        binary = Path(shutil.copy2(ckptfs_bin, tmp / "bin" / "ckptfs"))
        os.chmod(binary, 0o755)
        assert user_can_run(MEMBER, binary)
    with mounted(ckptfs_bin, src, tmp / "rootmnt") as rootmnt:
        refs = {v: P.root_reads(Path(rootmnt) / v) for v in P.VIEWS}
    refs.update({s: (src / s).read_bytes() for s in P.SIDE_FILES})
    mnt = P.mount_point(tmp, owner=uid)
    try:
        r = P.as_user(MEMBER, binary, src, mnt, "-o", "index_cache=off", timeout=120)
        assert r.returncode == 0, P.shown(r)
        assert is_mounted(mnt)
        for name in P.VIEWS + P.SIDE_FILES:
            P.assert_reads(P.as_user(MEMBER, "cat", mnt / name), refs[name])
        for rel, is_dir in ((".", True), ("model.safetensors", False), ("config.json", False), ("fp32", True)):
            r = P.as_user(MEMBER, "stat", "-c", "%u %g %a", mnt / rel)
            assert r.returncode == 0, P.shown(r)
            want_uid, want_gid, want_mode = P.expected_node(rel, is_dir, src)
            assert (want_uid, want_gid) == (uid, gid)
            assert r.stdout.decode().split() == [str(uid), str(gid), f"{want_mode:o}"], (rel, P.shown(r))
        with pytest.raises(PermissionError):  # no allow_other: FUSE lets only the mounting user in
            os.stat(mnt / "config.json")
        u = P.as_user(MEMBER, "fusermount3", "-u", mnt)
        assert u.returncode == 0, P.shown(u)
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            P.as_user(MEMBER, "fusermount3", "-u", mnt)
            unmount(str(mnt))
        wait_until(lambda: not server_pids(mnt))


def test_overrides_give_the_operators_policy(ckptfs_bin, tmp):
    """-o uid=<nobody>,gid=<nogroup>,umask=0022 over a 0700 source: every node nobody's, files 0444, dirs
    0555, and nobody reads (the operator's choice overrides the sources')."""
    src = P.copy_example(tmp / "ckpt")
    os.chmod(src, 0o700)
    uid, gid = P.uid_of(OTHER), P.gid_of("nogroup")
    with mounted(ckptfs_bin, src, P.mount_point(tmp),
                 "-o", f"allow_other,uid={uid},gid={gid},umask=0022") as mnt:
        mnt = Path(mnt)
        refs = {v: P.root_reads(mnt / v) for v in P.VIEWS + ["ckptfs.json"]}
        refs.update({s: (src / s).read_bytes() for s in P.SIDE_FILES})
        nobody_reads(mnt, list(refs), refs)
        ls = P.as_user(OTHER, "ls", mnt)
        assert ls.returncode == 0 and "model.safetensors" in ls.stdout.decode().split(), P.shown(ls)
        bad = P.access_mismatches(mnt, src, lambda rel, is_dir: (uid, gid, 0o555 if is_dir else 0o444))
        assert not bad, "\n".join(bad)


def test_owner_override_keeps_the_sources_modes(ckptfs_bin, users, tmp):
    """-o uid=<nobody>,gid=<nogroup> without umask over a root:GROUP checkpoint (dirs 0750, files 0640): the
    owner and group are replaced, the modes stay those the sources give (0550 / 0440), so nobody, the owner
    now, reads, while the member of GROUP, now in no class but others, is refused."""
    src = P.copy_example(tmp / "ckpt")
    P.set_tree(src, 0o750, 0o640, 0, P.gid_of(GROUP))
    uid, gid = P.uid_of(OTHER), P.gid_of("nogroup")
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", f"allow_other,uid={uid},gid={gid}") as mnt:
        mnt = Path(mnt)
        refs = {v: P.root_reads(mnt / v) for v in P.VIEWS}
        refs.update({s: (src / s).read_bytes() for s in P.SIDE_FILES})
        nobody_reads(mnt, list(refs), refs)
        P.assert_denied(P.as_user(MEMBER, "ls", mnt))
        P.assert_denied(P.as_user(MEMBER, "cat", mnt / "config.json"))
        bad = P.access_mismatches(mnt, src, lambda rel, is_dir: (uid, gid, P.expected_node(rel, is_dir, src)[2]))
        assert not bad, "\n".join(bad)
        assert stat.S_IMODE(os.stat(mnt / "model.safetensors").st_mode) == 0o440


def test_override_umask_0077_denies_others(ckptfs_bin, tmp):
    """-o uid=0,gid=0,umask=0077 over a checkpoint everyone can read on disk (0755/0644): every node root's,
    files 0400, dirs 0500; nobody is refused."""
    src = P.copy_example(tmp / "ckpt")
    P.assert_reads(P.as_user(OTHER, "cat", src / "config.json"), (src / "config.json").read_bytes())  # on disk
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other,uid=0,gid=0,umask=0077") as mnt:
        mnt = Path(mnt)
        P.assert_denied(P.as_user(OTHER, "ls", mnt))
        nobody_is_refused(mnt, ["config.json", "model.safetensors"])
        assert P.root_reads(mnt / "config.json") == (src / "config.json").read_bytes()
        bad = P.access_mismatches(mnt, src, lambda rel, is_dir: (0, 0, 0o500 if is_dir else 0o400))
        assert not bad, "\n".join(bad)


def test_stat_walk_of_a_group_checkpoint(ckptfs_bin, users, tmp):
    """Dirs 0750, files 0640, all daemon:GROUP, mounted with -o stats: every file of the mount (views,
    tags/, universal/, side files, ckptfs.json, ckptfs-stats.json) is 0440 and every dir 0550, daemon:GROUP,
    as the sources' stat gives them."""
    src = P.copy_example(tmp / "ckpt")
    uid, gid = P.uid_of("daemon"), P.gid_of(GROUP)
    P.set_tree(src, 0o750, 0o640, uid, gid)
    with mounted(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other,stats") as mnt:
        nodes = P.walk_mount(mnt)
        names = {rel for rel, _, _ in nodes}
        for must in P.VIEWS + P.SIDE_FILES + ["ckptfs.json", "ckptfs-stats.json", "fp32", "tags", f"tags/{TAG}",
                                              f"tags/{TAG}/model.safetensors"]:
            assert must in names, must
        bad = [f"{rel}: uid {st.st_uid} gid {st.st_gid} mode {stat.S_IMODE(st.st_mode):04o}"
               for rel, is_dir, st in nodes
               if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (uid, gid, 0o550 if is_dir else 0o440)]
        assert not bad, f"expected daemon:{GROUP}, files 0440, dirs 0550:\n" + "\n".join(bad)
        assert_access_as_sources_say(mnt, src)
        # and the member reads through it, nobody does not
        P.assert_reads(P.as_user(MEMBER, "cat", Path(mnt) / "config.json"), (src / "config.json").read_bytes())
        P.assert_denied(P.as_user(OTHER, "cat", Path(mnt) / "config.json"))


def test_modes_come_from_the_sources_not_the_index_cache(ckptfs_bin, tmp):
    """The index is written while SRC and its tag dir are 0755; then both become 0700 (the files untouched, so
    the index stays valid and is loaded): the mount shows the modes of now, and nobody is refused."""
    src = P.copy_example(tmp / "ckpt")
    cache = tmp / "cache"
    H.assert_ok(run_ckptfs(ckptfs_bin, "index", src, "--cache", cache))
    os.chmod(src / TAG, 0o700)
    os.chmod(src, 0o700)
    with foreground(ckptfs_bin, src, P.mount_point(tmp), "-o", "allow_other", index_cache=cache) as proc:
        mnt = tmp / "mnt"
        line = proc.stderr.readline()  # what -f says before serving
        assert line.startswith("ckptfs: index loaded from"), line
        P.assert_denied(P.as_user(OTHER, "ls", mnt))
        nobody_is_refused(mnt, ["config.json", "model.safetensors"])
        assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o500
        assert_access_as_sources_say(mnt, src)
