"""The S3 client (src/s3/) against a real store: Ceph's radosgw in the Debian unstable chroot
(mount_tests/s3_gateway.py), driven through the test-only build/ckptfs_s3_probe (CKPTFS_S3_PROBE).

Covers: listing across pages (max-keys=2 over more objects), ranged reads byte-exact against the uploaded
files, If-Match after the object is replaced (object changed), a wrong secret (SignatureDoesNotMatch), an
unknown key id (InvalidAccessKeyId), a missing bucket (NoSuchBucket), the gateway stopped (an error within
the bounded retry time) and restarted (works again). The gateway's ops log cross-checks what was sent.
"""
import json
import os
import random
import subprocess
import time

import pytest

import helpers as H
from s3_gateway import s3_gateway  # noqa: F401 (the session fixture)

PROBE = os.environ.get("CKPTFS_S3_PROBE", os.path.join(H.REPO, "build", "ckptfs_s3_probe"))
BUCKET = "ckptfs-client"
PREFIX = "ckpt/global_step7"
# Refused connections: kMaxAttempts tries and backoffs of at most 0.2 + 0.4 + 0.8 s (include/ckptfs/s3.hpp).
REFUSED_BOUND_S = 5


@pytest.fixture(scope="module")
def store(s3_gateway, tmp_path_factory):  # noqa: F811
    """A bucket holding a small tree (two levels, odd key characters, an empty file, a 3 MiB file)."""
    if not os.access(PROBE, os.X_OK):
        pytest.fail(f"{PROBE} not built: cmake --build build -j2 --target ckptfs_s3_probe", pytrace=False)
    tree = tmp_path_factory.mktemp("s3-tree")
    rng = random.Random(19)
    files = {"latest": b"global_step7\n", "zero.bin": b"",
             "mp_rank_00_model_states.pt": rng.randbytes(3 * 1024 * 1024 + 17),
             "sub dir/a+b=c~d.bin": rng.randbytes(4099)}
    files.update({f"shards/zero_pp_rank_{i}_optim_states.pt": rng.randbytes(1000 + i) for i in range(5)})
    for name, data in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    s3_gateway.make_bucket(BUCKET)
    uploaded = s3_gateway.upload_tree(str(tree), BUCKET, PREFIX)
    assert sorted(uploaded) == sorted(f"{PREFIX}/{n}" for n in files)
    return s3_gateway, {f"{PREFIX}/{n}": d for n, d in files.items()}


def probe(gateway, *args, env=None, timeout=120):
    return subprocess.run([PROBE, *args], env=dict(os.environ, **(env or gateway.env())), capture_output=True,
                          timeout=timeout)


def ok(proc):
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def counters(proc):
    """(requests, retries) from the probe's last stderr line."""
    last = proc.stderr.decode().strip().splitlines()[-1]
    fields = dict(f.split("=") for f in last.split())
    return int(fields["requests"]), int(fields["retries"])


def listing(gateway, prefix, max_keys=None):
    proc = probe(gateway, "list", f"s3://{BUCKET}/{prefix}", *([str(max_keys)] if max_keys else []))
    return [json.loads(line) for line in ok(proc).decode().splitlines()], proc


def test_list_follows_continuation_tokens(store):
    gateway, files = store
    objects, proc = listing(gateway, PREFIX + "/", max_keys=2)
    assert [o["key"] for o in objects] == sorted(files)
    assert {o["key"]: o["size"] for o in objects} == {k: len(d) for k, d in files.items()}
    assert all(o["etag"].startswith('"') and o["etag"].endswith('"') for o in objects)
    requests, retries = counters(proc)
    assert (requests, retries) == (-(-len(files) // 2), 0)  # ceil(n / 2) pages, one request each
    # One page of the store's default size holds them all; a narrower prefix lists only its keys.
    whole, proc = listing(gateway, PREFIX + "/")
    assert whole == objects and counters(proc) == (1, 0)
    shards, _ = listing(gateway, PREFIX + "/shards/", max_keys=2)
    assert [o["key"] for o in shards] == sorted(k for k in files if "/shards/" in k)


def test_head_reports_size_and_etag(store):
    gateway, files = store
    key = f"{PREFIX}/sub dir/a+b=c~d.bin"
    info = json.loads(ok(probe(gateway, "head", f"s3://{BUCKET}/{key}")))
    listed = {o["key"]: o for o in listing(gateway, PREFIX + "/")[0]}
    assert info["size"] == len(files[key])
    assert info["etag"] == listed[key]["etag"]
    assert info["last_modified"].endswith("GMT")


@pytest.mark.parametrize("offset,length", [(0, 1), (100, 4), (5000, 100), (1 << 20, 1 << 20),
                                           (3 * 1024 * 1024 + 17 - 33, 33), (0, 3 * 1024 * 1024 + 17)])
def test_ranged_reads_are_byte_exact(store, offset, length):
    gateway, files = store
    key = f"{PREFIX}/mp_rank_00_model_states.pt"
    etag = json.loads(ok(probe(gateway, "head", f"s3://{BUCKET}/{key}")))["etag"]
    before = len(gateway_log_gets(gateway, key))
    data = ok(probe(gateway, "get", f"s3://{BUCKET}/{key}", str(offset), str(length), etag))
    assert data == files[key][offset:offset + length]
    # The gateway sent that many bytes of the object, in one request (its ops log counts headers out).
    gets = wait_for_log(gateway, key, before + 1)
    assert gets[-1]["http_status"] in ("200", "206") and gets[-1]["bytes_sent"] >= length


def test_range_past_the_end_is_refused(store):
    gateway, files = store
    key = f"{PREFIX}/latest"
    proc = probe(gateway, "get", f"s3://{BUCKET}/{key}", str(len(files[key])), "4")
    assert proc.returncode == 3
    assert b"HTTP 416 InvalidRange" in proc.stderr and f"s3://{BUCKET}/{key}".encode() in proc.stderr


def test_replaced_object_is_an_object_changed_error(store):
    gateway, _ = store
    key = f"{PREFIX}/replaced.bin"
    gateway.put_bytes(BUCKET, key, b"A" * 4096)
    etag = json.loads(ok(probe(gateway, "head", f"s3://{BUCKET}/{key}")))["etag"]
    assert ok(probe(gateway, "get", f"s3://{BUCKET}/{key}", "10", "20", etag)) == b"A" * 20
    gateway.put_bytes(BUCKET, key, b"B" * 4096)  # same size, other bytes
    proc = probe(gateway, "get", f"s3://{BUCKET}/{key}", "10", "20", etag)
    assert proc.returncode == 10, proc.stderr
    err = proc.stderr.decode()
    assert "object changed" in err and f"s3://{BUCKET}/{key}" in err and "412" in err
    assert proc.stdout == b""  # never the new bytes
    gateway.delete(BUCKET, key)


@pytest.mark.parametrize("who,code", [("wrong secret", "SignatureDoesNotMatch"),
                                      ("unknown key", "InvalidAccessKeyId")])
def test_bad_credentials_name_the_s3_code(store, who, code):
    gateway, _ = store
    env = gateway.env(secret_key="not-the-secret") if who == "wrong secret" else gateway.env(access_key="NOSUCHKEY")
    for args in (["list", f"s3://{BUCKET}/{PREFIX}"], ["get", f"s3://{BUCKET}/{PREFIX}/latest", "0", "4"]):
        proc = probe(gateway, *args, env=env)
        err = proc.stderr.decode()
        assert proc.returncode == 3, err
        assert f"HTTP 403 {code}" in err and f"s3://{BUCKET}/" in err and gateway.endpoint in err
        assert counters(proc) == (1, 0)  # an answer, not a transient failure: no retry
        assert "not-the-secret" not in err and gateway.secret_key not in err


def test_missing_bucket_is_no_such_bucket(store):
    gateway, _ = store
    for args in (["list", "s3://no-such-bucket/ckpt"], ["get", "s3://no-such-bucket/ckpt/latest", "0", "4"]):
        proc = probe(gateway, *args)
        assert proc.returncode == 3
        assert b"HTTP 404 NoSuchBucket" in proc.stderr and b"s3://no-such-bucket/ckpt" in proc.stderr


def test_stopped_gateway_fails_in_bounded_time_then_recovers(store):
    gateway, files = store
    key = f"{PREFIX}/sub dir/a+b=c~d.bin"
    gateway.stop()
    try:
        start = time.monotonic()
        proc = probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", "16", timeout=60)
        elapsed = time.monotonic() - start
        err = proc.stderr.decode()
        assert proc.returncode == 3, err
        assert "cannot reach the store" in err and f"s3://{BUCKET}/{key}" in err
        assert counters(proc) == (4, 3)  # kMaxAttempts
        assert elapsed < REFUSED_BOUND_S
    finally:
        gateway.start()
    assert ok(probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", "16")) == files[key][:16]
    assert len(listing(gateway, PREFIX + "/")[0]) == len(files)


def gateway_log_gets(gateway, key):
    return [e for e in gateway.ops_log() if e["operation"] == "get_obj" and e["object"] == key]


def wait_for_log(gateway, key, n, timeout=10):
    """The ops log is written behind the answers: the GETs of `key` once there are n of them."""
    deadline = time.monotonic() + timeout
    while True:
        gets = gateway_log_gets(gateway, key)
        if len(gets) >= n or time.monotonic() > deadline:
            assert len(gets) >= n, f"{len(gets)} GETs of {key} in the ops log, expected {n}"
            return gets
        time.sleep(0.1)
