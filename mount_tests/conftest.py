"""Shared fixtures for the ckptfs end-to-end tests.

Environment:
  CKPTFS_BIN        the binary under test (default: build/ckptfs)
  CKPTFS_FIXTURES   cache folder for the generated fixtures (default: build/fixtures); the generator
                    skips cases already there, so reruns are cheap
"""
import json
import os
import shutil
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import helpers as H  # noqa: E402

REPO = H.REPO
GENERATOR = os.path.join(HERE, "gen", "generate.py")
REAL_DIR = os.path.join(HERE, "fixtures", "deepspeed-real")          # DeepSpeed 0.14.5
REAL_019_DIR = os.path.join(HERE, "fixtures", "deepspeed-0.19-real")  # DeepSpeed 0.19.5
GEN_TIMEOUT = 900


def _abs(p):
    return p if os.path.isabs(p) else os.path.join(REPO, p)


@pytest.fixture(scope="session", autouse=True)
def session_index_cache(tmp_path_factory):
    """ckptfs keeps its index cache under $XDG_CACHE_HOME/ckptfs by default: never the user's here (this
    covers the session- and module-scoped fixtures; each test then gets its own, below)."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(autouse=True)
def private_index_cache(tmp_path, monkeypatch):
    """Each test its own empty default index cache: a mount or `ckptfs index` that relies on the default never
    loads what an earlier test indexed, whatever the order.  mounting.mounted/foreground pass
    `-o index_cache=off` unless a test asks for the index."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="session")
def ckptfs_bin():
    path = _abs(os.environ.get("CKPTFS_BIN", "build/ckptfs"))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"ckptfs binary not found or not executable: {path}\n"
                    f"build it with: cmake -B build && cmake --build build -j2 --target ckptfs "
                    f"(or point CKPTFS_BIN at it)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def fixtures_dir():
    """Generates (once, cached on disk) every default case and returns the folder."""
    out = _abs(os.environ.get("CKPTFS_FIXTURES", "build/fixtures"))
    proc = H.run([sys.executable, GENERATOR, out], timeout=GEN_TIMEOUT)
    if proc.returncode != 0:
        pytest.fail(f"fixture generator failed:\n{H.describe(proc)}", pytrace=False)
    return out


def case_info(fixtures_dir, name):
    with open(os.path.join(fixtures_dir, name, "case.json")) as f:
        return json.load(f)


def generate_only(names):
    """Generates (cached like the default ones) the ``--only`` cases ``names``; returns the fixtures folder."""
    out = _abs(os.environ.get("CKPTFS_FIXTURES", "build/fixtures"))
    proc = H.run([sys.executable, GENERATOR, out, "--only", *names], timeout=GEN_TIMEOUT)
    assert proc.returncode == 0, H.describe(proc)
    return out


def case_source(fixtures_dir, name):
    """What to give ckptfs for a generated case (case.json ``src``)."""
    return os.path.join(fixtures_dir, name, case_info(fixtures_dir, name)["src"])


@pytest.fixture(scope="session")
def export_cache(tmp_path_factory, ckptfs_bin):
    """export(src, tag=None, universal=False) -> (proc, out_dir); each distinct export runs once per session."""
    cache = {}
    base = tmp_path_factory.mktemp("exports")

    def export(src, tag=None, universal=False):
        key = (str(src), tag, universal)
        if key not in cache:
            out = base / f"e{len(cache)}"
            args = [ckptfs_bin, "export", src, out] + (["--tag", tag] if tag else []) + \
                (["--universal"] if universal else [])
            cache[key] = (H.run(args), out)
        return cache[key]

    return export


@pytest.fixture
def case_copy(fixtures_dir, tmp_path):
    """copy(name) -> path of a private copy of that case's checkpoint save dir."""
    def copy(name):
        dst = tmp_path / name
        shutil.copytree(os.path.join(fixtures_dir, name, "checkpoint"), dst)
        return dst
    return copy
