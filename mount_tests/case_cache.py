"""Cached generated fixtures: a case folder is reused while its case.json names the generator's version.
Standard library only: used by gen/generate.py (host) and by gen_dcp/run_generator.py (host) and
gen_dcp/generate_dcp.py (in the chroot, where run_generator.py copies this file beside it)."""
import json
import os
import shutil


def case_is_current(path, version):
    try:
        with open(os.path.join(path, "case.json")) as f:
            return json.load(f).get("generator_version") == version
    except (OSError, ValueError):
        return False


def install_case(case_dir, out_dir, name):
    """Moves a finished case folder to out_dir/name (same file system), replacing an older one."""
    final = os.path.join(out_dir, name)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(case_dir, final)
