#!/usr/bin/python3
"""Host side of the per-rank FSDP fixture generator: runs generate_fsdp_local.py inside the Debian unstable chroot
(torch 2.14, transformers 5.12: real FSDP1 and FSDP2 on gloo) and moves the finished cases to OUT_DIR.

    /usr/bin/python3 mount_tests/gen_fsdp_local/run_fsdp_local_generator.py OUT_DIR [--chroot DIR] [--only NAME ...]
        [--force]

The chroot is ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}.  A case whose case.json in OUT_DIR carries the current
GEN_VERSION is not generated again (gen_dcp/run_generator.generate).  Standard library only.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "gen_dcp")]
import run_generator as RUN  # noqa: E402 (gen_dcp's: runs a Suite in a chroot, caches its cases)
from fsdp_local_cases import CASES, GEN_VERSION  # noqa: E402

SUITE = RUN.Suite("generate_fsdp_local.py", tuple(os.path.join(d, f) for d, f in (
    (HERE, "fsdp_local_cases.py"), (HERE, "generate_fsdp_local.py"), (os.path.dirname(HERE), "case_cache.py"))),
    CASES, GEN_VERSION)


def default_chroot():
    return os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))


def generate(out_dir, chroot=None, only=None, force=False, timeout=RUN.TIMEOUT):
    """Returns (generated names, seconds, log); raises RuntimeError with the generator's output when it fails."""
    return RUN.generate(out_dir, os.path.abspath(chroot or default_chroot()), only, force, timeout, suite=SUITE)


def main(argv=None):
    return RUN.command_line(argv, __doc__, list(CASES), generate, "${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}")


if __name__ == "__main__":
    sys.exit(main())
