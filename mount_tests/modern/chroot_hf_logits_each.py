"""Runs chroot_hf_logits.py's --expected-logits checks on several model folders, each against its own logits
file, in one process (transformers is imported once, not once per folder: the per-folder runs cost ~10 s each).

    python3 chroot_hf_logits_each.py MODEL_DIR LOGITS_JSON [MODEL_DIR LOGITS_JSON ...]

Exit 1 if any check failed; one PASS/FAIL line per check, as chroot_hf_logits.py prints them.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroot_clients import print_versions, run_checks, summary  # noqa: E402
from chroot_hf_logits import check_expected_logits, transformers  # noqa: E402


def main(argv):
    assert argv and len(argv) % 2 == 0, __doc__
    print_versions()
    print(f"transformers {transformers.__version__}", flush=True)
    checks = []
    for folder, logits in zip(argv[::2], argv[1::2]):
        with open(logits) as f:
            checks += check_expected_logits(folder, json.load(f))
    return summary(len(checks), run_checks(checks, unit="values"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
