"""The S3 client (src/s3/) against a real store: Ceph's radosgw in the Debian unstable chroot
(mount_tests/s3_gateway.py), driven through the test-only build/ckptfs_s3_probe (CKPTFS_S3_PROBE).

Covers: listing across pages (max-keys=2 over more objects), ranged reads byte-exact against the uploaded
files, If-Match after the object is replaced (object changed), a wrong secret (SignatureDoesNotMatch), an
unknown key id (InvalidAccessKeyId), a missing bucket (NoSuchBucket), the gateway stopped (an error within
the bounded retry time) and restarted (works again), unsigned reads of a public bucket, credentials from a
profile file. The gateway's ops log cross-checks what was sent. Retries on 503, 429 and a dropped connection
are checked against a scripted HTTP server (the gateway cannot be made to answer those on demand).
"""
import http.server
import json
import os
import random
import subprocess
import threading
import time

import pytest

import helpers as H
from s3_gateway import s3_gateway  # noqa: F401 (the session fixture)

# One gateway and the fixtures it serves (fixed folder names), on one pytest-xdist worker (.ci/test).
pytestmark = pytest.mark.xdist_group("s3")

PROBE = os.environ.get("CKPTFS_S3_PROBE", os.path.join(H.REPO, "build", "ckptfs_s3_probe"))
BUCKET = "ckptfs-client"
PREFIX = "ckpt/global_step7"
# Refused connections: kMaxAttempts tries and backoffs of at most 0.2 + 0.4 + 0.8 s (include/ckptfs/s3.hpp).
REFUSED_BOUND_S = 5


@pytest.fixture(scope="module", autouse=True)
def probe_built():
    if not os.access(PROBE, os.X_OK):
        pytest.fail(f"{PROBE} not built: cmake --build build -j2 --target ckptfs_s3_probe", pytrace=False)


@pytest.fixture(scope="module")
def store(s3_gateway, tmp_path_factory):  # noqa: F811
    """A bucket holding a small tree (two levels, odd key characters, an empty file, a 3 MiB file)."""
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
    """Runs the probe with the gateway's environment, or `env` instead."""
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
    # The gateway sent that many bytes of the object, in one request (its ops log counts headers out). The
    # log lags the answers, and it logs the HEAD above as a get_obj of 0 bytes: that entry may come after
    # `before` was counted, so the GET is the new entry that sent bytes.
    deadline = time.monotonic() + 10
    while not [g for g in gateway_log_gets(gateway, key)[before:] if g["bytes_sent"] > 0] \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    sent = [g for g in gateway_log_gets(gateway, key)[before:] if g["bytes_sent"] > 0]
    assert len(sent) == 1 and sent[0]["http_status"] in ("200", "206") and sent[0]["bytes_sent"] >= length, sent


def test_parallel_reads_share_one_client(store):
    gateway, files = store
    key = f"{PREFIX}/mp_rank_00_model_states.pt"
    size = len(files[key])
    before = len(gateway_log_gets(gateway, key))
    proc = probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", str(size), "", "8")
    assert ok(proc) == files[key]
    assert counters(proc) == (8, 0)
    gets = wait_for_log(gateway, key, before + 8)[before:]
    assert sum(g["bytes_sent"] for g in gets) >= size and all(g["http_status"] == "206" for g in gets)


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


def get_while_down(gateway, down, up, key, length, timeout):
    """One probe get of `key`'s first `length` bytes with the gateway taken down by `down()` and brought back
    by `up()` after it; returns (proc, seconds it took)."""
    down()
    try:
        start = time.monotonic()
        proc = probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", str(length), timeout=timeout)
        return proc, time.monotonic() - start
    finally:
        up()


def test_stopped_gateway_fails_in_bounded_time_then_recovers(store):
    gateway, files = store
    key = f"{PREFIX}/sub dir/a+b=c~d.bin"
    proc, elapsed = get_while_down(gateway, gateway.stop, gateway.start, key, 16, timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 3, err
    assert "cannot reach the store" in err and f"s3://{BUCKET}/{key}" in err
    assert counters(proc) == (4, 3)  # kMaxAttempts
    assert elapsed < REFUSED_BOUND_S
    assert ok(probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", "16")) == files[key][:16]
    assert len(listing(gateway, PREFIX + "/")[0]) == len(files)


def test_frozen_gateway_fails_in_bounded_time(store):
    """A store that accepts connections and never answers (SIGSTOP): each attempt gives up after the stall
    timeout (kStallTimeoutS = 15 s), the request after kMaxAttempts of them: about a minute, not a hang."""
    gateway, files = store
    key = f"{PREFIX}/latest"
    proc, elapsed = get_while_down(gateway, gateway.pause, gateway.resume, key, 4, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 3 and "cannot reach the store" in err and "after 4 attempts" in err, err
    assert 4 * 15 <= elapsed < 4 * 15 + REFUSED_BOUND_S + 5, elapsed
    assert ok(probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", "4")) == files[key][:4]


def test_one_client_sees_the_gateway_go_and_come_back(store):
    """A long-lived client (a live mount's): its pooled connections die with the gateway; reads fail within
    the bound while it is down, and succeed again, the right bytes, once it is back."""
    gateway, files = store
    key = f"{PREFIX}/mp_rank_00_model_states.pt"
    etag = json.loads(ok(probe(gateway, "head", f"s3://{BUCKET}/{key}")))["etag"]
    watcher = subprocess.Popen([PROBE, "watch", f"s3://{BUCKET}/{key}", "1000", "64", etag, "7"],
                               env=dict(os.environ, **gateway.env()), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
        gateway.stop()
        time.sleep(2.5)
    finally:
        gateway.start()
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    reads = [json.loads(line) for line in out.decode().splitlines()]
    states = [r["ok"] for r in reads]
    # up, then down, then up again: each phase at least once, in that order
    first_down = states.index(False)
    back_up = states.index(True, first_down)
    assert all(states[:first_down]) and first_down > 0, states
    assert all(states[back_up:]), states
    want = files[key][1000:1064].hex()
    assert all(r["bytes"] == want for r in reads if r["ok"])
    for r in reads:
        if not r["ok"]:
            assert "cannot reach the store" in r["error"] or "HTTP 5" in r["error"], r["error"]
            assert r["ms"] < REFUSED_BOUND_S * 1000, r


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


def test_unsigned_reads_of_a_public_bucket(store):
    gateway, _ = store
    bucket, key = "ckptfs-public", "ckpt/latest"
    gateway.make_bucket(bucket, acl="public-read")
    gateway.put_bytes(bucket, key, b"global_step1\n", acl="public-read")
    anonymous = {"AWS_ENDPOINT_URL": gateway.endpoint, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                 "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    assert ok(probe(gateway, "--no-sign", "get", f"s3://{bucket}/{key}", "7", "5", env=anonymous)) == b"step1"
    # The private bucket refuses the same anonymous read, and says so.
    proc = probe(gateway, "--no-sign", "get", f"s3://{BUCKET}/{PREFIX}/latest", "0", "4", env=anonymous)
    assert proc.returncode == 3 and b"HTTP 403 AccessDenied" in proc.stderr


def test_credentials_from_a_profile_file(store, tmp_path):
    gateway, files = store
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n"
                     f"[ckptfs]\naws_access_key_id = {gateway.access_key}\n"
                     f"aws_secret_access_key = {gateway.secret_key}\n")
    env = {"AWS_ENDPOINT_URL": gateway.endpoint, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_PROFILE": "ckptfs"}
    key = f"{PREFIX}/latest"
    assert ok(probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", "6", env=env)) == files[key][:6]
    proc = probe(gateway, "get", f"s3://{BUCKET}/{key}", "0", "6", env=dict(env, AWS_PROFILE="default"))
    assert proc.returncode == 3 and b"InvalidAccessKeyId" in proc.stderr


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers the n-th request with script[n]: an HTTP status (with an S3 error body), "drop" (the
    connection closed without an answer) or "short" (a 206 of 3 bytes); past the script, a 200 with a
    one-object listing."""
    script = []
    seen = 0
    LISTING = (b'<?xml version="1.0"?><ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key>'
               b'<Size>3</Size><ETag>"e"</ETag></Contents></ListBucketResult>')

    def do_GET(self):  # noqa: N802 (http.server's name)
        n, Scripted.seen = Scripted.seen, Scripted.seen + 1
        step = Scripted.script[n] if n < len(Scripted.script) else 200
        if step == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if step == "short":
            step, body = 206, b"abc"
        else:
            body = self.LISTING if step == 200 else b"<Error><Code>SlowDown</Code><Message>busy</Message></Error>"
        self.send_response(step)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def run(script, *args):
        Scripted.script, Scripted.seen = script, 0
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}", "AWS_ACCESS_KEY_ID": "K",
               "AWS_SECRET_ACCESS_KEY": "S", "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        return probe(None, *(args or ("list", "s3://bucket1/ckpt")), env=env, timeout=60), Scripted.seen
    yield run
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("script", [[503], [429, 500], ["drop", 503, "drop"]], ids=str)
def test_transient_failures_are_retried(scripted_server, script):
    proc, served = scripted_server(script)
    assert [json.loads(line)["key"] for line in ok(proc).decode().splitlines()] == ["k"]
    assert counters(proc) == (len(script) + 1, len(script)) and served == len(script) + 1


def test_retries_are_bounded(scripted_server):
    start = time.monotonic()
    proc, served = scripted_server([503] * 10)
    err = proc.stderr.decode()
    assert proc.returncode == 3 and "HTTP 503 SlowDown: busy (after 4 attempts)" in err, err
    assert counters(proc) == (4, 3) and served == 4
    assert time.monotonic() - start < REFUSED_BOUND_S


def test_client_errors_are_not_retried(scripted_server):
    proc, served = scripted_server([404])
    assert proc.returncode == 3 and b"HTTP 404 SlowDown" in proc.stderr
    assert counters(proc) == (1, 0) and served == 1


@pytest.mark.parametrize("script,answer", [([200], "answered more bytes than the range asked for"),
                                           (["short"], "asked for bytes 10-19, the store answered 3 bytes")],
                         ids=["range ignored", "short"])
def test_wrong_sized_answers_are_errors(scripted_server, script, answer):
    """A store that ignores Range (radosgw's plain dbstore backend does) or answers short: an error, never
    wrong or missing bytes."""
    proc, _ = scripted_server(script, "get", "s3://bucket1/ckpt/x", "10", "10")
    err = proc.stderr.decode()
    assert proc.returncode == 3 and answer in err and "s3://bucket1/ckpt/x" in err, err
    assert proc.stdout == b""
