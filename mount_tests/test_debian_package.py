"""The Debian package (debian/), the proof that a user's install works on a clean machine: .ci/build-deb builds
it with `dpkg-buildpackage -us -uc -b` from a copy of the checkout without .git (as from a tarball) and checks
it with lintian; it is installed with `apt-get install ./ckptfs_*.deb` in a fresh Debian 12 chroot
(`debootstrap --variant=minbase bookworm`, no build tools, man-db added; the debootstrapped tree is cached in
/var/cache/ckptfs/bookworm and copied for each run); there the installed /usr/bin/ckptfs and mount(8) through
/sbin/mount.ckptfs mount the bundled example, whose views, read inside the chroot, are compared with the
fixture generator's own expected tensors; `man ckptfs`, `man mount.ckptfs` and the bash completion work there.

About 5 minutes on 2 idle cores (the package build is a second build of ckptfs, with ccache where it is
installed: seconds), plus about 2 minutes the first time for debootstrap."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import helpers as H
import test_man_pages as M
from conftest import case_info, generate_only
from test_example import assert_same_files
from test_mount import assert_view_holds, expected_views
from test_version import project_version

BASE = Path(os.environ.get("CKPTFS_BOOKWORM_CHROOT", "/var/cache/ckptfs/bookworm"))
MIRROR = os.environ.get("CKPTFS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
EXAMPLE = Path(H.REPO) / "examples" / "deepspeed-zero3-bf16"
EXAMPLE_CASE = "z3_bf16_dp2"  # the generator case the example is (test_example.py)
# Debian's runtime libraries ckptfs links, as dh_shlibdeps finds them, and the FUSE tools.
RUNTIME_DEPENDS = ["libfuse3-3", "libcurl4", "liblz4-1", "libre2-9", "libfmt9", "libzstd1", "libyaml-cpp0.7", "fuse3"]
NEEDED_TOOLS = ["dpkg-buildpackage", "dh", "lintian", "debootstrap", "chroot"]

pytestmark = [
    pytest.mark.timeout(2400),
    pytest.mark.xdist_group("debian_package"),  # one package build and chroot (fixed paths), on one worker
    pytest.mark.skipif(os.geteuid() != 0, reason="chroot, debootstrap and mounts need root"),
    pytest.mark.skipif(not all(shutil.which(t) for t in NEEDED_TOOLS),
                       reason=f"needs {', '.join(NEEDED_TOOLS)} (.ci/install-deps installs them)"),
]


def in_chroot(root, *args, timeout=600, check=True, text=True):
    proc = subprocess.run(["chroot", str(root), "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                           "DEBIAN_FRONTEND=noninteractive", *args], capture_output=True, text=text, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def mounts_below(root):
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted((p for p in points if p.startswith(f"{root}/")), reverse=True)


def bookworm_base():
    """The cached minbase bookworm tree with man-db (debootstrapped once; the stamp marks it complete)."""
    stamp = BASE / ".ckptfs-chroot-complete"
    if stamp.exists():
        return BASE
    assert not mounts_below(BASE), f"mounts left below {BASE}: unmount them"
    shutil.rmtree(BASE, ignore_errors=True)
    BASE.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(BASE), MIRROR], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, f"debootstrap failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    shutil.copy("/etc/resolv.conf", BASE / "etc" / "resolv.conf")
    in_chroot(BASE, "apt-get", "update", "-qq")
    in_chroot(BASE, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "man-db")
    in_chroot(BASE, "apt-get", "clean")
    stamp.write_text(in_chroot(BASE, "dpkg-query", "-W", "-f", "${Package} ${Version}\n").stdout)
    return BASE


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    """(path of the .deb, what .ci/build-deb printed: lintian's report)."""
    out = tmp_path_factory.mktemp("deb")
    proc = subprocess.run(["bash", os.path.join(H.REPO, ".ci", "build-deb"), str(out)], capture_output=True, text=True,
                          timeout=2400)
    assert proc.returncode == 0, f"build-deb failed:\n{proc.stdout}\n{proc.stderr}"
    return Path(proc.stdout.strip().split("\n")[-1]), proc.stdout


@pytest.fixture(scope="module")
def chroot(deb, tmp_path_factory):
    """A fresh copy of the bookworm tree with the package installed by apt-get, and the example in /root."""
    root = tmp_path_factory.mktemp("bookworm") / "root"
    subprocess.run(["cp", "-a", str(bookworm_base()), str(root)], check=True, timeout=600)
    try:
        os.mknod(root / "dev" / "fuse", 0o20666, os.makedev(10, 229))
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True, timeout=60)
        shutil.copy(deb[0], root / "tmp")
        shutil.copytree(EXAMPLE, root / "root" / "example")
        in_chroot(root, "apt-get", "update", "-qq")
        in_chroot(root, "sh", "-c", "cd /tmp && apt-get install -y -q ./ckptfs_*.deb")
        yield root
    finally:
        for point in mounts_below(root):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)
        if not mounts_below(root):  # never delete through a mount
            shutil.rmtree(root.parent, ignore_errors=True)


def test_package_is_lintian_clean_with_the_runtime_depends(deb):
    path, report = deb
    assert path.name == f"ckptfs_{project_version()}_amd64.deb"
    assert not re.search(r"^[EW]: ", report, re.M), report  # (build-deb fails on them too)
    depends = subprocess.run(["dpkg-deb", "-f", str(path), "Depends"], capture_output=True, text=True).stdout
    names = {d.split()[0] for d in depends.replace("|", ",").split(",") if d.strip()}
    assert set(RUNTIME_DEPENDS) <= names, depends
    files = subprocess.run(["dpkg-deb", "-c", str(path)], capture_output=True, text=True).stdout
    for f in ("./usr/bin/ckptfs", "./sbin/mount.ckptfs", "./lib/systemd/system/ckptfs@.service",
              "./usr/share/man/man1/ckptfs.1.gz", "./usr/share/man/man8/mount.ckptfs.8.gz",
              "./usr/share/bash-completion/completions/ckptfs", "./usr/share/doc/ckptfs/README.md.gz",
              "./usr/share/doc/ckptfs/docs/mount.md.gz", "./usr/share/doc/ckptfs/docs/exit-codes.md",
              "./usr/share/doc/ckptfs/copyright"):
        assert re.search(rf" {re.escape(f)}$", files, re.M), f"{f} not in the package:\n{files}"


def test_installed_on_a_machine_without_build_tools(chroot):
    assert "install ok installed" in in_chroot(chroot, "dpkg-query", "-W", "-f", "${Status}", "ckptfs").stdout
    for tool in ("gcc", "cc", "c++", "cmake", "make", "dpkg-buildpackage"):
        assert in_chroot(chroot, "sh", "-c", f"command -v {tool}", check=False).returncode != 0, tool
    # from a tarball's tree: the version and no revision
    assert in_chroot(chroot, "ckptfs", "--version").stdout.strip() == \
        f"ckptfs {project_version()} (no git revision: not built from a git checkout)"
    unit = (chroot / "lib" / "systemd" / "system" / "ckptfs@.service").read_text()
    assert re.search(r"^ExecStart=/usr/bin/ckptfs ", unit, re.M), "the unit runs another ckptfs than the package's"


def check_mount(chroot, mnt, exp):
    """Every view of the example, read inside the chroot, holds the generator's expected tensors."""
    for view in exp:
        raw = in_chroot(chroot, "cat", f"{mnt}/{view}", text=False).stdout
        assert_view_holds(view, raw, exp)


@pytest.fixture(scope="module")
def expected():
    """{view: expected tensors} of the example: the generator's, for the case the example is a copy of."""
    fixtures = generate_only([EXAMPLE_CASE])
    assert_same_files(EXAMPLE, Path(fixtures) / EXAMPLE_CASE / "checkpoint")
    return expected_views(fixtures, case_info(fixtures, EXAMPLE_CASE))


def test_installed_ckptfs_mounts_the_example(chroot, expected):
    in_chroot(chroot, "mkdir", "-p", "/mnt/merged")
    in_chroot(chroot, "ckptfs", "/root/example", "/mnt/merged")
    try:
        listing = in_chroot(chroot, "ls", "/mnt/merged").stdout.split()
        assert {"model.safetensors", "fp32", "universal", "tags", "ckptfs.json", "config.json"} <= set(listing)
        check_mount(chroot, "/mnt/merged", expected)
    finally:
        in_chroot(chroot, "fusermount3", "-u", "/mnt/merged", check=False)
    assert "/mnt/merged" not in in_chroot(chroot, "cat", "/proc/self/mounts").stdout


def test_mount_t_ckptfs_runs_the_helper(chroot, expected):
    in_chroot(chroot, "mkdir", "-p", "/mnt/helper")
    in_chroot(chroot, "mount", "-t", "ckptfs", "/root/example", "/mnt/helper", "-o", "nofail,tag=global_step3")
    try:
        assert re.search(r"^/root/example /mnt/helper fuse\.ckptfs ro,", in_chroot(chroot, "cat", "/proc/self/mounts").stdout,
                         re.M)
        check_mount(chroot, "/mnt/helper", expected)
    finally:
        in_chroot(chroot, "umount", "/mnt/helper", check=False)


def test_man_pages_are_installed(chroot):
    env = ["env", "MANPAGER=cat", "MANWIDTH=100", "LC_ALL=C.UTF-8"]
    page = in_chroot(chroot, *env, "man", "ckptfs").stdout
    assert "ckptfs - mount a sharded training checkpoint" in page and "MOUNT OPTIONS" in page, page[:2000]
    for option in M.parser_mount_options():
        assert option in page, option
    page = in_chroot(chroot, *env, "man", "8", "mount.ckptfs").stdout
    assert "mount.ckptfs - mount(8) helper" in page, page[:2000]


def test_bash_completion_loads_and_reads_the_tags(chroot):
    """bash-completion (a Recommends, installed with the package) loads the completion on demand; a TAB after
    --tag lists the example's tag, read by the installed ckptfs."""
    line = "ckptfs inspect /root/example --tag "
    script = f"""source /usr/share/bash-completion/bash_completion
_completion_loader ckptfs
complete -p ckptfs
COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=(ckptfs inspect /root/example --tag ''); COMP_CWORD=4
_ckptfs
printf 'reply %s\\n' "${{COMPREPLY[@]}}"
"""
    out = in_chroot(chroot, "bash", "-c", script).stdout
    assert "complete -F _ckptfs ckptfs" in out, out
    assert re.findall(r"^reply (.*)$", out, re.M) == ["global_step3"], out
