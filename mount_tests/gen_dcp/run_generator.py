#!/usr/bin/python3
"""Host side of the DCP fixture generator: runs generate_dcp.py inside the Debian 13 chroot (torch 2.6,
real torch.distributed.checkpoint) and moves the finished cases to OUT_DIR.

    /usr/bin/python3 mount_tests/gen_dcp/run_generator.py OUT_DIR [--chroot DIR] [--only NAME ...] [--force]
        [--torch 2.14]   (generate_dcp214.py in the Debian unstable chroot: the torch 2.14 layouts)

The chroot is ${CKPTFS_CHROOT:-build/trixie} (made by mount_tests/modern/setup_chroot.sh; .ci/run uses
/var/cache/ckptfs/trixie).  SOURCES are copied to CHROOT/tmp/ckptfs-gen-dcp-<pid>/, the cases are
written there and renamed into OUT_DIR (same file system) or copied; nothing is mounted.  A case whose
case.json in OUT_DIR carries the current GEN_VERSION is not generated again.  Standard library only.
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
sys.path.insert(0, HERE)
sys.path.append(TESTS)
from case_cache import case_is_current, generation_lock  # noqa: E402
from dcp_cases import CASES, CASES_214, GEN_VERSION, GEN_VERSION_214  # noqa: E402

TIMEOUT = 900
SOURCES = (os.path.join(HERE, "dcp_cases.py"), os.path.join(HERE, "generate_dcp.py"),
           os.path.join(HERE, "generate_dcp214.py"), os.path.join(TESTS, "case_cache.py"),
           os.path.join(TESTS, "llama_layout.py"))  # copied side by side

# A generator: its script (run in the chroot as `script OUT --force --only NAME...`), the files copied beside
# it, its case names and version.  generate_hf_storage.py (torch 2.14, the sid chroot) is another.
Suite = collections.namedtuple("Suite", "script sources cases version")
DCP_SUITE = Suite("generate_dcp.py", SOURCES, CASES, GEN_VERSION)
# The torch 2.14 layouts (per-rank metadata, zstd, SAFETENSORS format, float8), in the Debian unstable chroot.
DCP214_SUITE = Suite("generate_dcp214.py", SOURCES, CASES_214, GEN_VERSION_214)
SUITES_BY_TORCH = {"2.6": DCP_SUITE, "2.14": DCP214_SUITE}


def default_chroot(variable="CKPTFS_CHROOT", default="build/trixie"):
    c = os.environ.get(variable, default)
    return os.path.abspath(c if os.path.isabs(c) else os.path.join(REPO, c))


def chroot_ready(chroot):
    return os.path.isfile(os.path.join(chroot, ".ckptfs-chroot-complete"))


def in_chroot_cmd(chroot, *args, tmpdir="/tmp"):
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", f"TMPDIR={tmpdir}", "USE_LIBUV=0",
           "MASTER_ADDR=127.0.0.1", "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "PYTHONDONTWRITEBYTECODE=1"]
    return ["chroot", chroot, *env, *args]


def generate(out_dir, chroot=None, only=None, force=False, timeout=TIMEOUT, suite=DCP_SUITE):
    """Makes every case of `only` (default: all of the suite's) current in out_dir.  Returns (generated names,
    seconds, log); raises RuntimeError with the generator's output when it fails."""
    with generation_lock(out_dir):  # one generator at a time per folder (pytest-xdist workers)
        return _generate(out_dir, chroot, only, force, timeout, suite)


def _generate(out_dir, chroot, only, force, timeout, suite):
    chroot = chroot or default_chroot()
    out_dir = os.path.abspath(out_dir)
    names = list(only or suite.cases)
    todo = [n for n in names if force or not case_is_current(os.path.join(out_dir, n), suite.version)]
    if not todo:
        return [], 0.0, "every case is current"
    if not chroot_ready(chroot):
        raise RuntimeError(f"the chroot for {suite.script} is not set up ({chroot}/.ckptfs-chroot-complete "
                           f"missing): run `bash mount_tests/modern/setup_chroot.sh` (or point CKPTFS_CHROOT / "
                           f"CKPTFS_SID_CHROOT at it)")
    label = suite.script.removesuffix(".py")
    tag = f"ckptfs-gen-{label}-{os.getpid()}"
    host = os.path.join(chroot, "tmp", tag)
    shutil.rmtree(host, ignore_errors=True)
    os.makedirs(os.path.join(host, "tmp"))  # TMPDIR: torch leaves a temp dir per import
    t0 = time.time()
    try:
        for f in suite.sources:
            shutil.copy(f, host)
        cmd = in_chroot_cmd(chroot, "python3", f"/tmp/{tag}/{suite.script}", f"/tmp/{tag}/out", "--force",
                            "--only", *todo, tmpdir=f"/tmp/{tag}/tmp")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{label} timed out after {timeout}s: {' '.join(cmd)}\n{e.stdout}\n{e.stderr}")
        log = "\n".join(l for l in (proc.stdout + proc.stderr).splitlines()
                        if "UCX" not in l and "cpuinfo" not in l)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed (exit {proc.returncode}): {' '.join(cmd)}\n{log[-6000:]}")
        os.makedirs(out_dir, exist_ok=True)
        for n in todo:
            src = os.path.join(host, "out", n)
            if not case_is_current(src, suite.version):
                raise RuntimeError(f"{label} wrote no current {n}/case.json\n{log[-6000:]}")
            tmp = os.path.join(out_dir, f".tmp-{n}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.move(src, tmp)
            final = os.path.join(out_dir, n)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
    finally:
        shutil.rmtree(host, ignore_errors=True)
    return todo, time.time() - t0, log


def main(argv=None):
    return command_line(argv, __doc__, list(CASES) + list(CASES_214),
                        lambda out, chroot, only, force, torch: generate(out, chroot, only, force,
                                                                         suite=SUITES_BY_TORCH[torch]),
                        "${CKPTFS_CHROOT:-build/trixie}", torch_versions=list(SUITES_BY_TORCH))


def command_line(argv, doc, names, generate_cases, default_chroot_help, torch_versions=None):
    """OUT_DIR [--chroot DIR] [--only NAME ...] [--force] [--torch V]: generate_cases(out_dir, chroot, only,
    force[, torch]), its log and a summary printed; returns the exit status."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--chroot", default=None, help=f"default: {default_chroot_help}")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=names)
    ap.add_argument("--force", action="store_true")
    if torch_versions:
        ap.add_argument("--torch", choices=torch_versions, default=torch_versions[0],
                        help="2.14: the torch 2.14 layouts (generate_dcp214.py; pass --chroot the unstable chroot)")
    args = ap.parse_args(argv)
    extra = (args.torch,) if torch_versions else ()
    try:
        done, secs, log = generate_cases(args.out_dir, args.chroot, args.only, args.force, *extra)
    except RuntimeError as e:
        print(f"run_generator: {e}", file=sys.stderr)
        return 1
    print(log)
    print(f"run_generator: {len(done)} case(s) generated in {secs:.1f} s into {os.path.abspath(args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
