"""`ckptfs --version`: the version of CMakeLists.txt's project() and the git revision the binary was built from
(cmake/git_revision.cmake at build time; a build outside a git checkout says so, see also
test_debian_package.py); the mount's ckptfs.json and the index cache carry the same."""
import json
import os
import re
import shutil
import subprocess

import pytest

import helpers as H
from mounting import mounted

EXAMPLE = os.path.join(H.REPO, "examples", "deepspeed-zero3-bf16")
SCRIPT = os.path.join(H.REPO, "cmake", "git_revision.cmake")
VERSION_LINE = re.compile(r"ckptfs (\S+) \((?:git ([0-9a-f]{40})(-dirty)?|no git revision: not built from a git checkout)\)")


def project_version():
    with open(os.path.join(H.REPO, "CMakeLists.txt")) as f:
        return re.search(r"^project\(ckptfs VERSION ([0-9.]+)", f.read(), re.M).group(1)


def version_line(ckptfs_bin):
    proc = H.run([ckptfs_bin, "--version"])
    H.assert_ok(proc)
    return proc.stdout.strip()


def git(*args, cwd=H.REPO):
    return subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=60)


def test_version_names_the_project_version_and_the_revision(ckptfs_bin):
    line = version_line(ckptfs_bin)
    m = VERSION_LINE.fullmatch(line)
    assert m, line
    assert m.group(1) == project_version()
    assert H.run([ckptfs_bin, "-V"]).stdout.strip() == line
    if git("rev-parse", "HEAD").returncode == 0:
        # built from this checkout: its HEAD, or a commit before it (a build older than the last commit)
        assert m.group(2), f"{line}: built in a git checkout, but no revision"
        assert git("merge-base", "--is-ancestor", m.group(2), "HEAD").returncode == 0, \
            f"{line}: {m.group(2)} is not HEAD ({git('rev-parse', 'HEAD').stdout.strip()}) nor before it"


def test_ckptfs_json_and_the_index_carry_the_version(ckptfs_bin, tmp_path):
    line = version_line(ckptfs_bin)
    m = VERSION_LINE.fullmatch(line)
    revision = m.group(2) + (m.group(3) or "") if m.group(2) else None
    with mounted(ckptfs_bin, EXAMPLE, tmp_path / "mnt") as mnt:
        info = json.loads((tmp_path / "mnt" / "ckptfs.json").read_text())
    assert info["ckptfs"] == {"version": project_version(), "git_revision": revision}, info["ckptfs"]
    H.assert_ok(H.run([ckptfs_bin, "index", EXAMPLE, "--cache", tmp_path / "cache"]))
    (index,) = (tmp_path / "cache").iterdir()
    assert line.encode() in index.read_bytes(), f"{index}: no '{line}'"


@pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("git"), reason="cmake and git are needed")
def test_the_revision_script_outside_and_inside_a_checkout(tmp_path):
    """cmake/git_revision.cmake on a tarball's tree (no .git), a checkout, the checkout with a tracked file
    changed, and a tree without .git inside another checkout."""
    def revision_of(source):
        out = tmp_path / "git_revision.cpp"
        proc = subprocess.run(["cmake", f"-DSOURCE_DIR={source}", f"-DOUTPUT={out}", "-P", SCRIPT],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return re.search(r'return "(.*)";', out.read_text()).group(1)

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "file").write_text("1\n")
    assert revision_of(tree) == ""
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "file"], [*env, "commit", "-qm", "one"]):
        assert git(*args, cwd=str(tree)).returncode == 0
    head = git("rev-parse", "HEAD", cwd=str(tree)).stdout.strip()
    assert revision_of(tree) == head
    (tree / "untracked").write_text("")
    assert revision_of(tree) == head, "an untracked file does not make the build dirty"
    (tree / "file").write_text("2\n")
    assert revision_of(tree) == head + "-dirty"
    assert revision_of(tree / "sub") == "", "a tree inside another checkout is not that checkout"
