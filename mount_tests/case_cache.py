"""Cached generated fixtures: a case folder is reused while its case.json names the generator's version.
Standard library only: used by gen/generate.py (host) and by gen_dcp/run_generator.py (host) and
gen_dcp/generate_dcp.py (in the chroot, where run_generator.py copies this file beside it)."""
import argparse
import contextlib
import fcntl
import json
import os
import shutil


def case_is_current(path, version):
    try:
        with open(os.path.join(path, "case.json")) as f:
            return json.load(f).get("generator_version") == version
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def generation_lock(out_dir):
    """Held while a generator decides which cases of out_dir to make and makes them: a concurrent run (another
    pytest-xdist worker, another session) waits for it, then finds those cases current instead of making them
    again or replacing them under a reader.  The lock file sits beside out_dir, so a case listing never sees it."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    with open(out_dir + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install_case(case_dir, out_dir, name):
    """Moves a finished case folder to out_dir/name (same file system), replacing an older one."""
    final = os.path.join(out_dir, name)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(case_dir, final)


def cases_to_generate(doc, cases, version, argv=None):
    """The command line of a case generator, ``OUT_DIR [--only NAME ...] [--force]``: returns (OUT_DIR, the
    names among ``cases`` asked for, in order, less those whose folder is current unless --force)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(cases))
    ap.add_argument("--force", action="store_true", help="regenerate cases that are current")
    args = ap.parse_args(argv)
    return args.out_dir, [n for n in (args.only or list(cases))
                          if args.force or not case_is_current(os.path.join(args.out_dir, n), version)]
