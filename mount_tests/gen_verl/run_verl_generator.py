#!/usr/bin/python3
"""Host side of the verl fixture generator: runs generate_verl.py inside each case's chroot (the Debian
unstable one, torch 2.14 and transformers, or the Debian 13 one, torch 2.6: real FSDP1 and FSDP2) and moves
the finished cases to OUT_DIR.

    /usr/bin/python3 mount_tests/gen_verl/run_verl_generator.py OUT_DIR [--chroot DIR] [--only NAME ...] [--force]

The chroots are ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid} and ${CKPTFS_CHROOT:-build/trixie}.  A case whose case.json in OUT_DIR carries the
current GEN_VERSION is not generated again (gen_dcp/run_generator.generate).  Standard library only.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TESTS, "gen_dcp"))
from run_generator import Suite, command_line, generate as generate_suite  # noqa: E402 (gen_dcp's)
from verl_cases import CASES, GEN_VERSION, chroot_of  # noqa: E402

TIMEOUT = 900
SOURCES = (os.path.join(HERE, "verl_cases.py"), os.path.join(HERE, "generate_verl.py"),
           os.path.join(TESTS, "case_cache.py"))
SUITE = Suite("generate_verl.py", SOURCES, CASES, GEN_VERSION)


CHROOTS = {  # a case's chroot (verl_cases.chroot_of) -> its path
    "sid": os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"),
    "trixie": os.environ.get("CKPTFS_CHROOT", os.path.join(os.path.dirname(TESTS), "build", "trixie")),
}


def default_chroot():
    return os.path.abspath(CHROOTS["sid"])


def generate(out_dir, chroot=None, only=None, force=False, timeout=TIMEOUT):
    """Each case in its own chroot (`chroot` overrides the sid one).  Returns (generated names, seconds, log)."""
    done, secs, logs = [], 0.0, []
    for which, path in CHROOTS.items():
        names = [n for n in (only or CASES) if chroot_of(n) == which]
        path = chroot if chroot and which == "sid" else path
        if names:
            d, s, log = generate_suite(out_dir, os.path.abspath(path), names, force, timeout, suite=SUITE)
            done, secs, logs = done + d, secs + s, logs + [log]
    return done, secs, "\n".join(logs)


def main(argv=None):
    return command_line(argv, __doc__, list(CASES), generate, "${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}")


if __name__ == "__main__":
    sys.exit(main())
