#!/usr/bin/python3
"""Host side of the DCP fixture generator: runs generate_dcp.py inside the Debian 13 chroot (torch 2.6,
real torch.distributed.checkpoint) and moves the finished cases to OUT_DIR.

    /usr/bin/python3 mount_tests/gen_dcp/run_generator.py OUT_DIR [--chroot DIR] [--only NAME ...] [--force]

The chroot is ${CKPTFS_CHROOT:-build/trixie} (made by mount_tests/modern/setup_chroot.sh; .ci/run uses
/var/cache/ckptfs/trixie).  SOURCES are copied to CHROOT/tmp/ckptfs-gen-dcp-<pid>/, the cases are
written there and renamed into OUT_DIR (same file system) or copied; nothing is mounted.  A case whose
case.json in OUT_DIR carries the current GEN_VERSION is not generated again.  Standard library only.
"""
import argparse
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
from case_cache import case_is_current  # noqa: E402
from dcp_cases import CASES, GEN_VERSION  # noqa: E402

TIMEOUT = 900
SOURCES = (os.path.join(HERE, "dcp_cases.py"), os.path.join(HERE, "generate_dcp.py"),
           os.path.join(TESTS, "case_cache.py"))  # copied side by side into the chroot


def default_chroot():
    c = os.environ.get("CKPTFS_CHROOT", "build/trixie")
    return os.path.abspath(c if os.path.isabs(c) else os.path.join(REPO, c))


def chroot_ready(chroot):
    return os.path.isfile(os.path.join(chroot, ".ckptfs-chroot-complete"))


def in_chroot_cmd(chroot, *args, tmpdir="/tmp"):
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", f"TMPDIR={tmpdir}", "USE_LIBUV=0",
           "MASTER_ADDR=127.0.0.1", "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "PYTHONDONTWRITEBYTECODE=1"]
    return ["chroot", chroot, *env, *args]


def generate(out_dir, chroot=None, only=None, force=False, timeout=TIMEOUT):
    """Makes every case of `only` (default: all) current in out_dir.  Returns (generated names, seconds, log);
    raises RuntimeError with the generator's output when it fails."""
    chroot = chroot or default_chroot()
    return generate_in_chroot(out_dir, chroot, list(only or CASES), GEN_VERSION, SOURCES, "generate_dcp.py",
                              "DCP", "the Debian 13 chroot", force, timeout)


def generate_in_chroot(out_dir, chroot, names, version, sources, script, label, chroot_name, force=False,
                       timeout=TIMEOUT):
    """Runs `script` (one of `sources`, copied side by side into CHROOT/tmp) for the cases of `names` whose
    case.json in out_dir lacks generator_version `version`, and moves them into out_dir.  Returns (generated
    names, seconds, log); raises RuntimeError with the generator's output when it fails."""
    out_dir = os.path.abspath(out_dir)
    todo = [n for n in names if force or not case_is_current(os.path.join(out_dir, n), version)]
    if not todo:
        return [], 0.0, "every case is current"
    if not chroot_ready(chroot):
        raise RuntimeError(f"{chroot_name} is not set up ({chroot}/.ckptfs-chroot-complete missing): run "
                           f"`bash mount_tests/modern/setup_chroot.sh` (or point CKPTFS_CHROOT at it)")
    tag = f"ckptfs-gen-{label.lower()}-{os.getpid()}"
    host = os.path.join(chroot, "tmp", tag)
    shutil.rmtree(host, ignore_errors=True)
    os.makedirs(os.path.join(host, "tmp"))  # TMPDIR: torch leaves a temp dir per import
    t0 = time.time()
    try:
        for f in sources:
            shutil.copy(f, host)
        cmd = in_chroot_cmd(chroot, "python3", f"/tmp/{tag}/{script}", f"/tmp/{tag}/out", "--force",
                            "--only", *todo, tmpdir=f"/tmp/{tag}/tmp")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{label} generator timed out after {timeout}s: {' '.join(cmd)}\n{e.stdout}\n{e.stderr}")
        log = "\n".join(l for l in (proc.stdout + proc.stderr).splitlines()
                        if "UCX" not in l and "cpuinfo" not in l)
        if proc.returncode != 0:
            raise RuntimeError(f"{label} generator failed (exit {proc.returncode}): {' '.join(cmd)}\n{log[-6000:]}")
        os.makedirs(out_dir, exist_ok=True)
        for n in todo:
            src = os.path.join(host, "out", n)
            if not case_is_current(src, version):
                raise RuntimeError(f"{label} generator wrote no current {n}/case.json\n{log[-6000:]}")
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
    return command_line(argv, __doc__, CASES, generate, "${CKPTFS_CHROOT:-build/trixie}")


def command_line(argv, doc, cases, generate_cases, default_chroot_help):
    """OUT_DIR [--chroot DIR] [--only NAME ...] [--force]: generate_cases(out_dir, chroot, only, force), its
    log and a summary printed; returns the exit status."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--chroot", default=None, help=f"default: {default_chroot_help}")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(cases))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    try:
        done, secs, log = generate_cases(args.out_dir, args.chroot, args.only, args.force)
    except RuntimeError as e:
        print(f"run_generator: {e}", file=sys.stderr)
        return 1
    print(log)
    print(f"run_generator: {len(done)} case(s) generated in {secs:.1f} s into {os.path.abspath(args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
