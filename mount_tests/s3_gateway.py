"""A real S3 store for the tests: Ceph's gateway (radosgw, Debian unstable) run standalone with its POSIX
driver inside the unstable chroot ${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid} (mount_tests/modern/setup_chroot.sh
installs radosgw and curl there), listening on 127.0.0.1 on a free port. The recipe and why this one:
docs/s3.md.

    def test_x(s3_gateway):
        s3_gateway.make_bucket("b1")
        keys = s3_gateway.upload_tree(local_dir, "b1", "ckpt")
        env = s3_gateway.env()        # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for the client under test
        s3_gateway.stop(); s3_gateway.start()
        s3_gateway.ops_log()          # the gateway's own record of each request (operation, bytes_sent, ...)

The fixture is session-scoped and skips (with the reason) only when the chroot is missing; a chroot without
radosgw is a failure (CI builds it with radosgw).

Quirks of this gateway (radosgw 20.2, POSIX driver), found setting it up:
- it needs /proc (its PUT links an O_TMPFILE through /proc/self/fd): each command here runs in a private
  mount namespace with a fresh proc mounted on CHROOT/proc, gone when the command ends;
- SigV4 requests need an x-amz-content-sha256 header (libcurl 7.88 does not send one);
- the signature covers the query as sent: it must be in canonical form (sorted, '/' as %2F), or 403
  SignatureDoesNotMatch;
- its ops log (rgw_ops_log_file_path) is written shortly after the answers, and entries flushed together
  have no newline between them;
- without `tcp_nodelay=1` on its beast frontend, every small answer (a 100-byte range) waits ~40 ms (Nagle
  against the client's delayed ACK): 44 ms per small GET instead of under 1 ms.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen_dcp"))
import run_generator as RG  # noqa: E402 (chroot_ready: the chroot's completion stamp)

SID = os.path.abspath(os.environ.get("CKPTFS_SID_CHROOT", "/var/cache/ckptfs/sid"))
REGION = "us-east-1"
ACCESS_KEY = "CKPTFSTESTKEY"
SECRET_KEY = "ckptfs-test-secret"
START_TIMEOUT = 60
STOP_TIMEOUT = 15
CURL_TIMEOUT = 120
PATH_ENV = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]

CONF = """[global]
fsid = 00000000-0000-0000-0000-000000000001
auth_client_required = none
auth_cluster_required = none
auth_service_required = none
[client.rgw.test]
rgw_backend_store = dbstore
rgw_filter = posix
rgw_posix_base_path = {root}/posixroot
rgw_posix_database_root = {root}/posixdb
dbstore_db_dir = {root}/db
rgw_config_store = dbstore
rgw_config_store_db_dir = {root}/db
rgw_frontends = beast endpoint=127.0.0.1:{port} tcp_nodelay=1
log_file = {root}/radosgw.log
rgw_enable_ops_log = true
rgw_ops_log_rados = false
rgw_ops_log_file_path = {root}/ops.log
"""


def in_sid(*args):
    """The command line that runs `args` in the chroot with its own /proc (see the module's quirks). The private
    mount namespace drops the copies it took of ckptfs mounts: a gateway started while one exists would hold
    its FUSE connection, and the ckptfs server would not exit at its unmount until the gateway does."""
    script = ('mount -t proc proc "$0/proc" || exit 1; '
              'for m in $(grep -w fuse.ckptfs /proc/self/mountinfo | cut -d" " -f5); do umount -l "$m"; done; '
              'exec chroot "$0" "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, SID, *PATH_ENV, *args]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """One radosgw with its state (config, database, POSIX root, logs) under CHROOT/tmp/ckptfs-rgw-*/."""

    def __init__(self):
        self.host_root = tempfile.mkdtemp(prefix="ckptfs-rgw-", dir=os.path.join(SID, "tmp"))
        self.root = "/" + os.path.relpath(self.host_root, SID)  # the same folder, seen from inside
        for d in ("posixroot", "posixdb", "db"):
            os.makedirs(os.path.join(self.host_root, d))
        self.port = free_port()
        with open(os.path.join(self.host_root, "rgw.conf"), "w") as f:
            f.write(CONF.format(root=self.root, port=self.port))
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.region, self.access_key, self.secret_key = REGION, ACCESS_KEY, SECRET_KEY
        self.proc = None
        self._admin("user", "create", "--uid=tester", "--display-name=tester", f"--access-key={ACCESS_KEY}",
                    f"--secret={SECRET_KEY}")

    def _ceph_args(self):
        return ["-c", f"{self.root}/rgw.conf", "-n", "client.rgw.test", "--no-mon-config"]

    def _admin(self, *args):
        p = subprocess.run(in_sid("radosgw-admin", *self._ceph_args(), *args), capture_output=True, text=True,
                           timeout=START_TIMEOUT)
        if p.returncode != 0:
            raise RuntimeError(f"radosgw-admin {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return p.stdout

    # -- life cycle ---------------------------------------------------------------------------------------
    def start(self):
        assert self.proc is None, "the gateway is already running"
        out = open(os.path.join(self.host_root, "radosgw.out"), "ab")
        # unshare, sh and chroot exec in turn: the pid is radosgw's own.
        self.proc = subprocess.Popen(in_sid("radosgw", *self._ceph_args(), "-f"), stdout=out,
                                     stderr=subprocess.STDOUT)
        out.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"radosgw exited at start:\n{self.log_tail()}")
            if self.answers():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"radosgw did not answer on {self.endpoint} within {START_TIMEOUT} s:\n{self.log_tail()}")

    def stop(self):
        """Kills the gateway (the state stays: start() brings the same buckets back)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)  # were it paused, SIGTERM would wait
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def pause(self):
        """Freezes the gateway (SIGSTOP): connections are accepted by the kernel, nothing is answered."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def restart(self):
        self.stop()
        self.start()

    def answers(self):
        """Whether an HTTP answer (any status) comes back from the endpoint."""
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def close(self):
        self.stop()
        shutil.rmtree(self.host_root, ignore_errors=True)

    def log_tail(self, n=40):
        lines = []
        for name in ("radosgw.out", "radosgw.log"):
            try:
                with open(os.path.join(self.host_root, name), errors="replace") as f:
                    lines += f.readlines()[-n:]
            except OSError:
                pass
        return "".join(lines)

    # -- what clients under test need ---------------------------------------------------------------------
    def env(self, secret_key=None, access_key=None):
        """The environment of a client under test (AWS variables only: no profile file is read)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region,
                "AWS_ACCESS_KEY_ID": access_key or self.access_key,
                "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

    def url(self, bucket, key=""):
        return f"{self.endpoint}/{bucket}/{urllib.parse.quote(key, safe='/~')}" if key else f"{self.endpoint}/{bucket}"

    def ops_log(self):
        """The gateway's ops log: one dict per request served (operation, uri, http_status, error_code,
        bytes_sent, object, ...), oldest first."""
        try:
            with open(os.path.join(self.host_root, "ops.log")) as f:
                text = f.read()
        except FileNotFoundError:
            return []
        # Entries written together come without a newline between them ({...}{...}), and the gateway appends
        # while we read: decode object after object, up to a half-written last one.
        decoder, entries, at = json.JSONDecoder(), [], 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            try:
                entry, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError:
                return entries
            entries.append(entry)

    # -- writing the store (with the chroot's curl, which signs SigV4 itself) -----------------------------
    def curl(self, method, url, stdin=None, headers=()):
        """Runs one signed request; returns (HTTP status, body)."""
        args = ["curl", "-sS", "--max-time", str(CURL_TIMEOUT), "-X", method, "-o", "-", "-w", "\n%{http_code}",
                "--aws-sigv4", f"aws:amz:{self.region}:s3", "--user", f"{self.access_key}:{self.secret_key}",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        for h in headers:
            args += ["-H", h]
        if stdin is not None:
            args += ["-T", "/dev/fd/0"]  # a regular file on stdin: curl sends its size, not chunks
        p = subprocess.run(in_sid(*args, url), stdin=stdin, capture_output=True, timeout=CURL_TIMEOUT + 10)
        if p.returncode != 0:
            raise RuntimeError(f"curl {method} {url} failed ({p.returncode}): {p.stderr.decode(errors='replace')}")
        body, _, status = p.stdout.rpartition(b"\n")
        return int(status), body

    def _expect(self, what, status, body, ok=(200,)):
        if status not in ok:
            raise RuntimeError(f"{what}: HTTP {status}: {body.decode(errors='replace')[:500]}")

    def make_bucket(self, bucket, acl=None):
        """`acl` "public-read": anonymous clients may list it (each object needs its own acl too)."""
        status, body = self.curl("PUT", self.url(bucket), headers=[f"x-amz-acl: {acl}"] if acl else ())
        self._expect(f"create bucket {bucket}", status, body)

    def put_file(self, bucket, key, path, acl=None):
        with open(path, "rb") as f:
            status, body = self.curl("PUT", self.url(bucket, key), stdin=f,
                                     headers=[f"x-amz-acl: {acl}"] if acl else ())
        self._expect(f"PUT {bucket}/{key}", status, body)

    def put_bytes(self, bucket, key, data, acl=None):
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            self.put_file(bucket, key, f.name, acl)

    def delete(self, bucket, key):
        status, body = self.curl("DELETE", self.url(bucket, key))
        self._expect(f"DELETE {bucket}/{key}", status, body, ok=(200, 204))

    def upload_tree(self, local_dir, bucket, prefix):
        """Every file below local_dir as PREFIX/relative/path (symlinks followed); returns {key: local path}."""
        uploaded = {}
        for dirpath, _, files in os.walk(local_dir, followlinks=True):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                key = "/".join(p for p in (prefix.strip("/"), os.path.relpath(path, local_dir)) if p)
                self.put_file(bucket, key, path)
                uploaded[key] = path
        return uploaded


@pytest.fixture(scope="session")
def s3_gateway():
    if not RG.chroot_ready(SID):
        pytest.skip(f"the Debian unstable chroot is not set up ({SID}/.ckptfs-chroot-complete missing): run "
                    f"`CKPTFS_CHROOT={SID} CKPTFS_CHROOT_SUITE=sid bash mount_tests/modern/setup_chroot.sh` or "
                    f"point CKPTFS_SID_CHROOT at one")
    if not os.path.exists(os.path.join(SID, "usr/bin/radosgw")):
        pytest.fail(f"{SID} has no radosgw: install `radosgw curl` in it (setup_chroot.sh's PACKAGES)",
                    pytrace=False)
    gateway = Gateway()
    try:
        gateway.start()
        yield gateway
    finally:
        gateway.close()
