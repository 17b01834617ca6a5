"""The block cache of remote objects (src/s3/block_cache.cpp) against a real store: Ceph's radosgw in the
Debian unstable chroot (mount_tests/s3_gateway.py), driven through the test-only build/ckptfs_s3_probe's
`cached` command (one BlockCache over one object, fed read / prefetch / stats lines on stdin).

Checks the bytes against the uploaded files and what was fetched against the gateway's own ops log: a
sequential reader fetches each byte once in block-sized GETs (reading one block ahead), a prefetched range
costs exactly its blocks (rounded to 64 KiB at its ends) and its reads no GET, parallel readers of one range
share the GETs, the on-disk cache serves a second process without a GET and never serves a replaced
object's bytes, an object replaced under a live cache fails with PreconditionFailed, and a store stopped
then restarted gives an error, then the bytes (a failed fetch is not cached).
"""
import json
import os
import random
import subprocess
import time

import pytest

import helpers as H
from s3_gateway import s3_gateway  # noqa: F401 (the session fixture)

# One gateway and the fixtures it serves (fixed folder names), on one pytest-xdist worker (.ci/test).
pytestmark = pytest.mark.xdist_group("s3")

PROBE = os.environ.get("CKPTFS_S3_PROBE", os.path.join(H.REPO, "build", "ckptfs_s3_probe"))
BUCKET = "ckptfs-cache"
KIB, MIB = 1024, 1024 * 1024
BLOCK = 1 * MIB  # block_kb=1024: GETs of at most 1 MiB, so that a 5 MiB object spans several
ALIGN = 64 * KIB  # BlockCacheOptions::align_bytes (include/ckptfs/s3_cache.hpp)
PAGE = 4 * KIB  # what a prefetch rounds its ranges out to (src/s3/block_cache.cpp kPage)
SIZE = 5 * MIB + 5


@pytest.fixture(scope="module", autouse=True)
def probe_built():
    if not os.access(PROBE, os.X_OK):
        pytest.fail(f"{PROBE} not built: cmake --build build -j2 --target ckptfs_s3_probe", pytrace=False)


@pytest.fixture(scope="module")
def gateway(s3_gateway):  # noqa: F811
    s3_gateway.make_bucket(BUCKET)
    return s3_gateway


@pytest.fixture
def obj(gateway, request):
    """An object of SIZE random bytes under a key of the test's own: (key, bytes)."""
    key = f"ckpt/{request.node.name}.bin"
    data = random.Random(request.node.name).randbytes(SIZE)
    gateway.put_bytes(BUCKET, key, data)
    return key, data


class Cached:
    """One probe process holding one BlockCache over s3://BUCKET/key."""

    def __init__(self, gateway, key, *settings):
        args = [PROBE, "cached", f"s3://{BUCKET}/{key}", f"block_kb={BLOCK // KIB}", *settings]
        self.proc = subprocess.Popen(args, env=dict(os.environ, **gateway.env()), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.info = self._answer()

    def _answer(self):
        line = self.proc.stdout.readline()
        assert line, f"the probe exited: {self.proc.stderr.read()}"
        return json.loads(line)

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def read(self, tmp_path, offset, length, chunk=0, threads=1):
        out = tmp_path / f"read-{offset}-{length}"
        answer = self.ask(f"read {offset} {length} {out} {chunk} {threads}")
        return out.read_bytes() if answer["ok"] else answer

    def stats(self):
        return self.ask("stats")

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=120) == 0, self.proc.stderr.read()


@pytest.fixture
def caches():
    opened = []
    yield lambda *a: opened.append(Cached(*a)) or opened[-1]
    for c in opened:
        if c.proc.poll() is None:
            c.close()


def gets_of(gateway, key):
    """The ranged GETs of `key` in the ops log (HEADs are logged as get_obj too: their uri says HEAD)."""
    return [e for e in gateway.ops_log()
            if e["operation"] == "get_obj" and e["object"] == key and e["uri"].startswith("GET ")]


def new_gets(gateway, key, before, expected, timeout=10):
    """The GETs of `key` logged after the first `before` once there are `expected` (the log lags answers);
    waits a little longer to see that no more come."""
    deadline = time.monotonic() + timeout
    while len(gets_of(gateway, key)) < before + expected and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    gets = gets_of(gateway, key)[before:]
    assert all(g["http_status"] == "206" for g in gets), [(g["http_status"], g["bytes_sent"]) for g in gets]
    return gets


def test_a_sequential_reader_fetches_each_byte_once_in_blocks(gateway, obj, caches, tmp_path):
    key, data = obj
    cache = caches(gateway, key)
    assert cache.info == {"etag": cache.info["etag"], "size": SIZE}
    assert cache.read(tmp_path, 0, SIZE, chunk=256 * KIB) == data
    # The first read is fetched as asked (256 KiB), the rest of its block once it looks sequential (and the
    # next block read ahead), then whole blocks, the last one 5 bytes.
    expected = [256 * KIB, BLOCK - 256 * KIB] + [BLOCK] * 4 + [5]
    gets = new_gets(gateway, key, 0, len(expected))
    assert sorted(g["bytes_sent"] for g in gets) == sorted(expected)
    stats = cache.stats()
    assert (stats["requests"], stats["bytes_fetched"]) == (len(expected), SIZE)


def test_a_prefetched_range_costs_its_blocks_and_its_reads_no_get(gateway, obj, caches, tmp_path):
    key, data = obj
    cache = caches(gateway, key)
    begin, end = 100_000, 100_000 + 3 * MIB
    assert cache.ask(f"prefetch {begin} {end - begin}")["ok"]
    assert cache.read(tmp_path, begin, end - begin, chunk=128 * KIB) == data[begin:end]
    # [begin, end) rounded out to pages, cut into equal parts of at most a block (pages, the last one shorter):
    # no over-fetch past its ends.
    lo, hi = begin // PAGE * PAGE, -(-end // PAGE) * PAGE
    parts = -(-(hi - lo) // BLOCK)
    part = -(-(-(-(hi - lo) // parts)) // PAGE) * PAGE
    cuts = list(range(lo, hi, part)) + [hi]
    expected = [b - a for a, b in zip(cuts, cuts[1:]) if b > a]
    assert len(expected) == parts
    gets = new_gets(gateway, key, 0, len(expected))
    assert sorted(g["bytes_sent"] for g in gets) == sorted(expected)  # in parallel: in any order
    assert sum(expected) <= 1.05 * (end - begin)
    stats = cache.stats()
    assert stats["misses"] == 0 and stats["hits"] > 0 and stats["requests"] == len(expected)


def test_parallel_readers_of_one_range_share_its_gets(gateway, obj, caches, tmp_path):
    key, data = obj
    cache = caches(gateway, key, "connections=4")
    assert cache.read(tmp_path, 0, 2 * MIB + 10, threads=8) == data[:2 * MIB + 10]
    gets = new_gets(gateway, key, 0, 3)
    assert sorted(g["bytes_sent"] for g in gets) == [ALIGN, BLOCK, BLOCK]
    assert cache.stats()["requests"] == 3


def test_the_disk_cache_serves_a_second_process_and_never_a_replaced_object(gateway, obj, caches, tmp_path):
    key, data = obj
    cache_dir = tmp_path / "cache"
    first = caches(gateway, key, f"dir={cache_dir}")
    assert first.read(tmp_path, 0, SIZE) == data
    first.close()
    files = os.listdir(cache_dir)
    assert len(files) == 6 and not any(".tmp-" in f for f in files), files
    before = len(new_gets(gateway, key, 0, 6))

    second = caches(gateway, key, f"dir={cache_dir}")
    assert second.read(tmp_path, 0, SIZE) == data
    assert second.read(tmp_path, 3 * MIB + 7, 1000) == data[3 * MIB + 7:3 * MIB + 1007]
    stats = second.stats()
    assert (stats["requests"], stats["disk_hits"]) == (0, 6)
    second.close()
    assert new_gets(gateway, key, before, 0) == []

    replaced = random.Random(1).randbytes(SIZE)
    gateway.put_bytes(BUCKET, key, replaced)
    third = caches(gateway, key, f"dir={cache_dir}")
    assert third.info["etag"] != first.info["etag"]
    assert third.read(tmp_path, 0, SIZE) == replaced
    stats = third.stats()
    assert (stats["requests"], stats["disk_hits"], stats["bytes_fetched"]) == (6, 0, SIZE)


def test_an_object_replaced_under_a_live_cache_fails_its_uncached_reads(gateway, obj, caches, tmp_path):
    key, data = obj
    cache = caches(gateway, key)
    assert cache.read(tmp_path, 0, 1000) == data[:1000]
    gateway.put_bytes(BUCKET, key, random.Random(2).randbytes(SIZE))
    answer = cache.read(tmp_path, 4 * MIB, 1000)
    assert answer["ok"] is False and answer["changed"] is True, answer
    assert answer["code"] == "PreconditionFailed", answer
    assert cache.read(tmp_path, 0, 1000) == data[:1000]  # the old version's own bytes, never mixed


def test_a_stopped_store_fails_the_read_and_the_restarted_one_serves_it(gateway, obj, caches, tmp_path):
    key, data = obj
    cache = caches(gateway, key)
    assert cache.read(tmp_path, 0, 1000) == data[:1000]
    gateway.stop()
    try:
        start = time.monotonic()
        answer = cache.read(tmp_path, 2 * MIB, 1000)
        assert answer["ok"] is False, answer
        assert time.monotonic() - start < 5  # refused connections: the client's bounded retries
    finally:
        gateway.start()
    assert cache.read(tmp_path, 2 * MIB, 1000) == data[2 * MIB:2 * MIB + 1000]
    assert cache.read(tmp_path, 0, 1000) == data[:1000]
