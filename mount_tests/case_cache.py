"""Cached generated fixtures: a case folder is reused while its case.json names the generator's version.
Standard library only: used by gen/generate.py (host) and by gen_dcp/run_generator.py (host) and
gen_dcp/generate_dcp.py (in the chroot, where run_generator.py copies this file beside it)."""
import json
import os


def case_is_current(path, version):
    try:
        with open(os.path.join(path, "case.json")) as f:
            return json.load(f).get("generator_version") == version
    except (OSError, ValueError):
        return False
