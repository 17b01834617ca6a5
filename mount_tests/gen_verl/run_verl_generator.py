#!/usr/bin/python3
"""Host side of the verl fixture generator: runs generate_verl.py inside the Debian unstable chroot (torch
2.14, transformers: real FSDP1 and FSDP2) and moves the finished cases to OUT_DIR.

    /usr/bin/python3 mount_tests/gen_verl/run_verl_generator.py OUT_DIR [--chroot DIR] [--only NAME ...] [--force]

The chroot is ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}.  A case whose case.json in OUT_DIR carries the
current GEN_VERSION is not generated again (gen_dcp/run_generator.generate_in_chroot).  Standard library only.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TESTS, "gen_dcp"))
from run_generator import command_line, generate_in_chroot  # noqa: E402 (gen_dcp's)
from verl_cases import CASES, GEN_VERSION  # noqa: E402

TIMEOUT = 900
SOURCES = (os.path.join(HERE, "verl_cases.py"), os.path.join(HERE, "generate_verl.py"),
           os.path.join(TESTS, "case_cache.py"))


def default_chroot():
    return os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))


def generate(out_dir, chroot=None, only=None, force=False, timeout=TIMEOUT):
    return generate_in_chroot(out_dir, chroot or default_chroot(), list(only or CASES), GEN_VERSION, SOURCES,
                              "generate_verl.py", "verl", "the Debian unstable chroot", force, timeout)


def main(argv=None):
    return command_line(argv, __doc__, CASES, generate, "${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}")


if __name__ == "__main__":
    sys.exit(main())
