"""Checkpoints on object storage (issue 19): `ckptfs s3://BUCKET/PREFIX MNT`, `inspect`, `export` and
`index` of an s3:// SRC, against Ceph's radosgw in the Debian unstable chroot (mount_tests/s3_gateway.py).

A handful of fixtures (real ones written by DeepSpeed, Megatron-LM, DCP with ZStandard, verl, a plain
torch.save file, and a generated DeepSpeed ZeRO-3 case) are uploaded as they lie on disk; each mounted from
the store must equal the local mount of the same directory in every file of every view, byte for byte (the
local mounts are checked against the frameworks' own outputs by the other test files). Also: errors at the
mount name the URL and the S3 code and exit 3 (wrong secret, missing bucket, empty prefix); an object replaced
under a live mount gives EIO on the reads that need it and the rest keeps working; the gateway stopped under
a live mount gives EIO within a bounded time, and reads work again once it is back; a remount of an unchanged
prefix loads the index and sends the store no GET (the gateway's ops log).
"""
import errno
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

import helpers as H
from mount_walk import info_without_live, tree_of
from mounting import foreground, mounted, run_ckptfs
from s3_gateway import s3_gateway  # noqa: F401 (the session fixture)

# One gateway and the fixtures it serves (fixed folder names), on one pytest-xdist worker (.ci/test).
pytestmark = pytest.mark.xdist_group("s3")

REPO = H.REPO
BUCKET = "ckptfs-mount"
# Buckets of their own for the tests that replace an object and that are refused. Everything is uploaded
# before the first listing: radosgw's POSIX driver (Ceph 20.2) lists an object uploaded after a listing of
# its bucket twice, the second time with a wrong size (which ckptfs refuses: docs/s3.md).
REPLACED_BUCKET = "ckptfs-replaced"
REFUSED_BUCKET = "ckptfs-refused"
# rank files larger than the parse read-ahead (src/io/remote_object.hpp): a view read fetches from them
REPLACED_SOURCE = "mount_tests/fixtures/megatron-real/legacy_tp2_pp2/checkpoint"
# (label, local source relative to the repo)
SOURCES = [
    ("deepspeed-z3-real", "mount_tests/fixtures/deepspeed-real/z3_fp16_ws2/checkpoint"),
    ("megatron-torch-dist-real", "mount_tests/fixtures/megatron-real/torch_dist_tp2_pp2/checkpoint"),
    ("megatron-legacy-real", "mount_tests/fixtures/megatron-real/legacy_tp2_pp2/checkpoint"),
    ("dcp-zstd-real", "mount_tests/fixtures/dcp-2.14-real/zstd_ws2/checkpoint"),
    ("verl-fsdp2-real", "mount_tests/fixtures/verl-real/fsdp2_fp32_ws2/checkpoint"),
    # FSDP1 LOCAL_STATE_DICT rank files cut by the names and shapes of the optimizer's DCP dir beside them
    ("fsdp-local-accelerate-real", "mount_tests/fixtures/fsdp-local-real/accelerate_llama_ws2_fp32_orig/checkpoint"),
    ("torch-save", "examples/torch-save-file/full_state.pt"),
    ("deepspeed-zero3-generated", "examples/deepspeed-zero3-bf16"),
    ("side-files", None),  # a copy of the generated ZeRO-3 case with side files larger than a splice's floor
]
# A read of a stopped gateway: refused connections cost about 1.4 s a request (include/ckptfs/s3.hpp); a
# read may need a few requests.
STOPPED_BOUND_S = 30
OPS_LOG_SETTLE_S = 2  # the gateway writes its ops log a little after each answer


def files_below(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def with_source_named(tree, local, url):
    """`tree` with the local source's path in ckptfs.json (which names the source) spelled as the URL."""
    real = os.path.realpath(local).encode()
    return {p: (v.replace(real, url.encode()) if v is not None and os.path.basename(p) == "ckptfs.json" else v)
            for p, v in tree.items()}


def without_how_it_follows(tree):
    """`tree` with the "live" section of its ckptfs.json files dropped: a live mount of an s3:// source polls, a
    local one watches (how each follows its save dir is test_live_run.py's)."""
    out = {}
    for p, v in tree.items():
        if v is not None and os.path.basename(p) == "ckptfs.json":
            v = json.dumps(info_without_live(v), sort_keys=True).encode()
        out[p] = v
    return out


def differences(ours, local):
    ours, local = without_how_it_follows(ours), without_how_it_follows(local)
    out = [f"{p}: only in the s3 mount" for p in ours.keys() - local.keys()]
    out += [f"{p}: only in the local mount" for p in local.keys() - ours.keys()]
    out += [f"{p}: {len(ours[p] or b'')} bytes differ from the local {len(local[p] or b'')}"
            for p in ours.keys() & local.keys() if ours[p] != local[p]]
    return sorted(out)


def ckptfs_env(gateway, **overrides):
    env = dict(os.environ, **gateway.env(**overrides))
    return env


def run_with(env, *args, timeout=120):
    return subprocess.run([*map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def with_large_side_files(root):
    """examples/deepspeed-zero3-bf16 with a 200 KiB tokenizer.json and a 1 MiB extra file beside it: served
    unchanged (passthrough), read in runs larger than catalog::kMinDeferredRun (which are spliced locally)."""
    local = os.path.join(root, "deepspeed-zero3-bf16")
    shutil.copytree(os.path.join(REPO, "examples/deepspeed-zero3-bf16"), local)
    rng = random.Random(19)
    with open(os.path.join(local, "tokenizer.json"), "w") as f:
        json.dump({"vocab": {f"t{i}": i for i in range(12000)}}, f)
    with open(os.path.join(local, "extra.bin"), "wb") as f:
        f.write(rng.randbytes(1 << 20))
    return local


@pytest.fixture(scope="module")
def store(s3_gateway, tmp_path_factory):  # noqa: F811
    """The bucket, with each source of SOURCES as LABEL/NAME (NAME: the source's own name, which tag names
    are taken from): {label: (url, local path)}."""
    s3_gateway.make_bucket(BUCKET)
    urls = {}
    for label, rel in SOURCES:
        local = os.path.join(REPO, rel) if rel else with_large_side_files(str(tmp_path_factory.mktemp("side")))
        key = f"{label}/{os.path.basename(local)}"
        if os.path.isfile(local):
            s3_gateway.put_file(BUCKET, key, local)
        else:
            s3_gateway.upload_tree(local, BUCKET, key)
        urls[label] = (f"s3://{BUCKET}/{key}", local)
    s3_gateway.make_bucket(REPLACED_BUCKET)
    s3_gateway.upload_tree(os.path.join(REPO, REPLACED_SOURCE), REPLACED_BUCKET, "checkpoint")
    s3_gateway.make_bucket(REFUSED_BUCKET)
    s3_gateway.put_bytes(REFUSED_BUCKET, "ckpt/latest", b"global_step1\n")
    return s3_gateway, urls


@pytest.fixture
def gateway_env(store, monkeypatch):
    """The AWS variables of the gateway in this process's environment (mounts inherit it)."""
    gateway, _ = store
    for k, v in gateway.env().items():
        monkeypatch.setenv(k, v)
    return gateway


@pytest.mark.parametrize("label", [label for label, _ in SOURCES])
def test_s3_mount_equals_local_mount(store, gateway_env, ckptfs_bin, tmp_path, label):
    _, urls = store
    url, local = urls[label]
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        expected = with_source_named(tree_of(mnt), local, url)
    with foreground(ckptfs_bin, url, tmp_path / "s3") as proc:
        ours = tree_of(tmp_path / "s3")
    log = proc.stderr.read()
    assert "read /" not in log, log  # no read failed, not even one the kernel retried page by page
    assert sum(1 for v in expected.values() if v) > 3, f"the local mount of {local} serves almost nothing"
    assert not differences(ours, expected), "\n".join(differences(ours, expected)[:20])


def test_inspect_and_export_of_s3_source(store, gateway_env, ckptfs_bin, tmp_path):
    _, urls = store
    url, local = urls["megatron-torch-dist-real"]
    proc = run_ckptfs(ckptfs_bin, "inspect", url, "--json")
    assert proc.returncode == 0, proc.stderr
    ours, theirs = json.loads(proc.stdout), json.loads(run_ckptfs(ckptfs_bin, "inspect", local, "--json").stdout)
    assert ours["framework"] == theirs["framework"]
    assert [t["name"] for t in ours["tags"]] == [t["name"] for t in theirs["tags"]]
    assert url in proc.stdout
    for src, out in ((url, tmp_path / "from-s3"), (local, tmp_path / "from-local")):
        proc = run_ckptfs(ckptfs_bin, "export", src, out)
        assert proc.returncode == 0, proc.stderr
    exported = {p: open(tmp_path / "from-s3" / p, "rb").read() for p in files_below(tmp_path / "from-local")}
    assert exported and all(exported[p] == open(tmp_path / "from-local" / p, "rb").read() for p in exported)
    assert sorted(files_below(tmp_path / "from-s3")) == sorted(exported)


def credentials_only(gateway, monkeypatch):
    """The gateway's keys in the environment, but neither its endpoint nor its region (the test names them)."""
    env = gateway.env()
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(k, env[k])


def test_endpoint_flags_instead_of_the_environment(store, ckptfs_bin, monkeypatch):
    gateway, urls = store
    url, _ = urls["dcp-zstd-real"]
    credentials_only(gateway, monkeypatch)
    proc = run_ckptfs(ckptfs_bin, "inspect", url, "--endpoint", gateway.endpoint, f"--region={gateway.region}")
    assert proc.returncode == 0, proc.stderr
    assert "framework:" in proc.stdout


def test_mount_flags_instead_of_the_environment(store, ckptfs_bin, tmp_path, monkeypatch):
    """A mount takes the flags inspect and export take for an s3:// SRC (12d2dc6 accepted and ignored them)."""
    gateway, urls = store
    url, local = urls["dcp-zstd-real"]
    credentials_only(gateway, monkeypatch)
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        expected = open(os.path.join(mnt, "model.safetensors"), "rb").read()
    with mounted(ckptfs_bin, url, tmp_path / "s3", "--endpoint", gateway.endpoint, f"--region={gateway.region}",
                 "--s3-path-style") as mnt:
        assert open(os.path.join(mnt, "model.safetensors"), "rb").read() == expected


def test_mount_options_instead_of_the_environment(store, ckptfs_bin, tmp_path, monkeypatch):
    gateway, urls = store
    url, local = urls["dcp-zstd-real"]
    credentials_only(gateway, monkeypatch)
    options = f"endpoint={gateway.endpoint},region={gateway.region},s3_path_style"
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        expected = open(os.path.join(mnt, "model.safetensors"), "rb").read()
    with mounted(ckptfs_bin, url, tmp_path / "s3", "-o", options) as mnt:
        assert open(os.path.join(mnt, "model.safetensors"), "rb").read() == expected
        with open("/proc/self/mountinfo") as f:
            assert any(url in line and str(tmp_path / "s3") in line for line in f)  # fsname: the URL


@pytest.mark.parametrize("case,code", [("wrong-secret", "SignatureDoesNotMatch"), ("no-bucket", "NoSuchBucket"),
                                       ("empty-prefix", "no objects under this prefix"),
                                       ("unreachable", "http://127.0.0.1:9")])
def test_refused_at_mount_with_url_and_code(store, ckptfs_bin, tmp_path, case, code):
    gateway, _ = store
    url = f"s3://{REFUSED_BUCKET}/ckpt"
    env = ckptfs_env(gateway)
    if case == "wrong-secret":
        env = ckptfs_env(gateway, secret_key="not-the-secret")
    elif case == "no-bucket":
        url = "s3://ckptfs-no-such-bucket/ckpt"
    elif case == "unreachable":  # nothing listens on the discard port: refused, retried within the bound
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"
    else:
        url = f"s3://{REFUSED_BUCKET}/nothing-here"
    os.makedirs(tmp_path / "mnt")
    proc = run_with(env, ckptfs_bin, url, tmp_path / "mnt", "-o", "index_cache=off")
    assert proc.returncode == 3, proc.stderr
    assert code in proc.stderr and url.split("/")[2] in proc.stderr, proc.stderr
    assert env["AWS_SECRET_ACCESS_KEY"] not in proc.stderr
    assert not os.listdir(tmp_path / "mnt")


def read_errno(path):
    try:
        with open(path, "rb") as f:
            f.read()
    except OSError as e:
        return e.errno
    return 0


def test_object_replaced_under_a_live_mount(store, gateway_env, ckptfs_bin, tmp_path):
    """A read that needs the store after an object was replaced gets EIO (bytes already in the block cache
    are the mounted version's and would be served as they are: a 1 MiB cache, smaller than the rank file,
    makes the read fetch)."""
    gateway, _ = store
    local = os.path.join(REPO, REPLACED_SOURCE)
    rank_file = "iter_0000003/mp_rank_00_000/model_optim_rng.pt"
    assert os.path.getsize(os.path.join(local, rank_file)) > 1 << 20
    with foreground(ckptfs_bin, f"s3://{REPLACED_BUCKET}/checkpoint", tmp_path / "mnt", "-o", "cache_mb=1") as proc:
        mnt = tmp_path / "mnt"
        data = open(os.path.join(local, rank_file), "rb").read()
        # same size, another ETag
        gateway.put_bytes(REPLACED_BUCKET, f"checkpoint/{rank_file}", data[:-1] + bytes([data[-1] ^ 1]))
        assert read_errno(mnt / "fp32" / "pytorch_model.bin") == errno.EIO
        # the files no replaced object backs are served as before
        with mounted(ckptfs_bin, local, tmp_path / "local") as local_mnt:
            assert open(mnt / "hf" / "config.json", "rb").read() == \
                open(os.path.join(local_mnt, "hf", "config.json"), "rb").read()
    log = proc.stderr.read()
    assert "changed since the mount" in log and rank_file in log, log


def test_gateway_stopped_then_restarted(store, gateway_env, ckptfs_bin, tmp_path):
    gateway, urls = store
    url, local = urls["megatron-legacy-real"]
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        expected = open(os.path.join(mnt, "model.safetensors"), "rb").read()
    with mounted(ckptfs_bin, url, tmp_path / "s3") as mnt:
        gateway.stop()
        try:
            started = time.monotonic()
            assert read_errno(os.path.join(mnt, "model.safetensors")) == errno.EIO
            assert time.monotonic() - started < STOPPED_BOUND_S
        finally:
            gateway.start()
        assert os.path.isdir(os.path.join(mnt, "fp32"))  # the mount stayed up
        with open(os.path.join(mnt, "model.safetensors"), "rb") as f:
            assert f.read() == expected


def test_parsing_costs_few_requests_per_rank_file(store, gateway_env, ckptfs_bin):
    """A torch.save rank file is parsed in a few GETs: its first bytes (data.pkl), its suffix (zip end records
    and central directory); its storages' local headers are checked when their bytes are first read (the few
    values a parse reads: a GET or two more; 8-9 GETs before); never much more than the file."""
    gateway, urls = store
    url, local = urls["megatron-legacy-real"]
    time.sleep(OPS_LOG_SETTLE_S)
    before = len(gateway.ops_log())
    proc = run_ckptfs(ckptfs_bin, "inspect", url)
    assert proc.returncode == 0, proc.stderr
    time.sleep(OPS_LOG_SETTLE_S)
    per_object = {}
    for e in object_gets(gateway, before):
        gets, sent = per_object.get(e["object"], (0, 0))
        per_object[e["object"]] = (gets + 1, sent + e["bytes_sent"])
    prefix = url[len(f"s3://{BUCKET}/"):] + "/"
    rank_files = {k: v for k, v in per_object.items() if k.endswith("model_optim_rng.pt")}
    assert len(rank_files) == 4, per_object
    for key, (gets, sent) in rank_files.items():
        size = os.path.getsize(os.path.join(local, key[len(prefix):]))
        assert gets <= 4 and sent <= size + (256 << 10), (key, gets, sent, size)


def object_gets(gateway, since):
    return [e for e in gateway.ops_log()[since:] if e["operation"] == "get_obj"]


def test_remount_of_unchanged_prefix_sends_no_get(store, gateway_env, ckptfs_bin, tmp_path):
    gateway, urls = store
    url, _ = urls["deepspeed-z3-real"]
    cache = tmp_path / "index"
    for attempt in ("parses", "loads"):
        time.sleep(OPS_LOG_SETTLE_S)
        before = len(gateway.ops_log())
        with foreground(ckptfs_bin, url, tmp_path / "mnt", index_cache=cache) as proc:
            said = proc.stderr.readline()
            os.listdir(tmp_path / "mnt")
        time.sleep(OPS_LOG_SETTLE_S)
        gets = object_gets(gateway, before)
        if attempt == "parses":
            assert "parsed the sources" in said, said
            assert gets, "the first mount read no object"
        else:
            assert "index loaded from" in said, said
            assert not gets, [e.get("object") for e in gets]
            ops = {e["operation"] for e in gateway.ops_log()[before:]}
            assert ops <= {"list_bucket"}, ops


def test_a_view_fetches_what_it_reads_and_says_so(store, gateway_env, ckptfs_bin, tmp_path):
    """Reading one view from the store (index loaded, so no parse request) fetches at most 1.05x the source
    bytes inspect says it reads, plus the block cache's 64 KiB alignment per object; ckptfs-stats.json's
    figures agree with the gateway's own log of the bytes it sent, and count what was served."""
    gateway, urls = store
    url, _ = urls["deepspeed-z3-real"]
    proc = run_ckptfs(ckptfs_bin, "inspect", "--json", url)
    assert proc.returncode == 0, proc.stderr
    views = {v["path"]: v for v in json.loads(proc.stdout)["tags"][0]["views"]}
    reads = views["fp32/model.safetensors"]["reads"]
    cache = tmp_path / "index"
    with mounted(ckptfs_bin, url, tmp_path / "warm", index_cache=cache):
        pass  # writes the index: the next mount parses nothing
    time.sleep(OPS_LOG_SETTLE_S)
    before = len(gateway.ops_log())
    with mounted(ckptfs_bin, url, tmp_path / "mnt", "-o", "stats", index_cache=cache) as mnt:
        data = open(os.path.join(mnt, "fp32", "model.safetensors"), "rb").read()
        with open(os.path.join(mnt, "ckptfs-stats.json")) as f:
            stats = json.load(f)
    time.sleep(OPS_LOG_SETTLE_S)
    sent = sum(e["bytes_sent"] for e in object_gets(gateway, before))
    fetched = stats[f"fetched from {url}"]
    objects = len(fetched["objects"])
    assert reads <= fetched["bytes_fetched"] <= 1.05 * reads + objects * (128 << 10), (reads, fetched)
    assert fetched["bytes_fetched"] == sent, (fetched, sent)
    assert stats["served"]["fp32/model.safetensors"] == len(data)


# A ZeRO-3 checkpoint whose fp32 partitions span several MiB a rank: generate.py's bench model at 8 ranks
# (vocab, hidden, ffn, layers), 4.2 MiB of masters in each 13 MB optim_states file.
ZERO3_RANKS, ZERO3_DIMS = 8, (8192, 512, 1024, 4)
ZERO3_BUCKET = "ckptfs-zero3"
# The mount's -o prefetch default, in MiB: over s3:// sources a sequential reader's window is refilled in
# steps of this many bytes of the view (docs/mount.md), each step a GET per rank object.
PREFETCH_STEP_MB = 32


@pytest.fixture(scope="module")
def zero3_store(s3_gateway):  # noqa: F811
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import bench_checkpoint
    fixtures = os.path.join(REPO, os.environ.get("CKPTFS_FIXTURES", "build/fixtures"))
    case = bench_checkpoint.make(os.path.join(fixtures, f"s3_zero3_dp{ZERO3_RANKS}"), ZERO3_RANKS, ZERO3_DIMS)
    s3_gateway.make_bucket(ZERO3_BUCKET)
    s3_gateway.upload_tree(os.path.join(case, "checkpoint"), ZERO3_BUCKET, "checkpoint")
    return s3_gateway, f"s3://{ZERO3_BUCKET}/checkpoint", os.path.join(case, "checkpoint"), bench_checkpoint.G


@pytest.fixture
def zero3_env(zero3_store, monkeypatch):
    """zero3_store, with its gateway's AWS variables in this process's environment (mounts inherit it)."""
    for k, v in zero3_store[0].env().items():
        monkeypatch.setenv(k, v)
    return zero3_store


def assert_matches_generator(local, view, raw):
    """The tensors of a safetensors view `raw` against the generator's sha256 manifest of the case whose
    checkpoint is `local` (fp32/ from fp32.manifest.json, the root's bf16 from model.manifest.json)."""
    manifest = "fp32.manifest.json" if view.startswith("fp32") else "model.manifest.json"
    with open(os.path.join(os.path.dirname(local), "expected", manifest)) as f:
        ref = json.load(f)
    ours = H.parse_safetensors(raw, view)
    assert sorted(ours) == sorted(ref), view
    for k, m in ref.items():
        assert str(ours[k].dtype) == "torch." + m["dtype"] and list(ours[k].shape) == m["shape"], (view, k)
        assert H.sha256_le(ours[k]) == m["sha256"], f"{view}: {k} differs from the generator's"


def master_bytes_per_rank(G):
    """The bytes of each rank's fp32 partition the fp32 view reads (its padding left out), from the generator's
    layout: param e's flat partition is ceil(numel / dp) elements a rank."""
    out = [0] * ZERO3_RANKS
    for e in G.bench_entries(ZERO3_DIMS):
        if e.kind != "train":
            continue
        numel = math.prod(e.shape)
        p = -(-numel // ZERO3_RANKS)
        for r in range(ZERO3_RANKS):
            out[r] += 4 * (min((r + 1) * p, numel) - min(r * p, numel))
    return out


def cold_fp32_read(zero3_store, ckptfs_bin, tmp_path, *options, view=os.path.join("fp32", "model.safetensors")):
    """The fp32 view (or `view`) of the ZeRO-3 store read front to back by a mount that parses nothing (its
    index cached), checked against the local mount's: {rank object name: [bytes of each GET]}."""
    gateway, url, local, G = zero3_store
    cache = tmp_path / "index"
    with mounted(ckptfs_bin, url, tmp_path / "warm", index_cache=cache):
        pass  # writes the index: the mount below parses nothing
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        expected = open(os.path.join(mnt, view), "rb").read()
    with mounted(ckptfs_bin, url, tmp_path / "mnt", *options, index_cache=cache) as mnt:
        time.sleep(OPS_LOG_SETTLE_S)
        before = len(gateway.ops_log())
        data = open(os.path.join(mnt, view), "rb").read()
    time.sleep(OPS_LOG_SETTLE_S)
    assert data == expected
    assert_matches_generator(local, view, data)
    per_object = {}
    for e in object_gets(gateway, before):
        per_object.setdefault(e["object"].rsplit("/", 1)[-1], []).append(e["bytes_sent"])
    return per_object, len(data)


def assert_fetched_once(per_object, G):
    """Every master byte fetched once: within 1.05x the masters plus the 64 KiB alignment of each end."""
    needed = sum(master_bytes_per_rank(G))
    fetched = sum(map(sum, per_object.values()))
    assert needed <= fetched <= 1.05 * needed + len(per_object) * (128 << 10), (fetched, needed)


def test_a_cold_zero3_view_is_fetched_in_few_large_gets(zero3_env, ckptfs_bin, tmp_path):
    """The fp32 view of a ZeRO-3 checkpoint takes a slice of every rank's partition per tensor: each window
    step of the view must reach each rank object as one GET, not one per tensor slice or per fraction of a
    MiB. Per object at most a GET per step of the view's bytes, plus 2 (the reads before the window starts,
    a storage boundary); fetched bytes within 1.05x the masters plus the 64 KiB alignment (3539876, a quarter
    of the window per step: 4-10 GETs an object, 43 in all)."""
    per_object, view_bytes = cold_fp32_read(zero3_env, ckptfs_bin, tmp_path)
    steps = -(-view_bytes // (PREFETCH_STEP_MB << 20))
    for name, sizes in per_object.items():  # the model-states files: a small buffer (rank 0)
        assert len(sizes) <= steps + 2, (name, steps, sizes)
    assert sum(map(len, per_object.values())) <= steps * ZERO3_RANKS + 2 * len(per_object), per_object
    assert_fetched_once(per_object, zero3_env[3])


@pytest.mark.parametrize("cache_mb", [32, 64])
@pytest.mark.parametrize("view", ["fp32/model.safetensors", "model.safetensors"])
def test_a_small_cache_still_fetches_each_byte_once(zero3_env, ckptfs_bin, tmp_path, cache_mb, view):
    """With -o cache_mb below the default the window over s3:// sources shrinks with the cache (two thirds
    of it less the reads in flight, half of it at 32 MiB and below: two thirds of 32 MiB fetched 1.19x of
    the bf16 view), in source bytes (the bf16 view reads two of its fp32 masters per byte: a window of view
    bytes fetched 1.09x at 64 ranks): no prefetched bytes dropped and fetched again by the read. (At 16 MiB
    and below, the view's slices of 2 MiB a rank, and the kernel's reads in flight, outgrow the cache:
    1.1-1.6x.)"""
    per_object, _ = cold_fp32_read(zero3_env, ckptfs_bin, tmp_path, "-o", f"cache_mb={cache_mb}", view=view)
    assert_fetched_once(per_object, zero3_env[3])

def test_a_torch_save_is_parsed_in_two_gets(zero3_env, ckptfs_bin, tmp_path):
    """Parsing a torch.save over s3:// costs its suffix (zip end records, central directory) and its first
    bytes (data.pkl): each storage's local header is checked at the first read of its bytes, in the GET that
    fetches them (12d2dc6: 8-10 GETs per optimizer file, one per group of headers). The view read afterwards
    equals the local mount's and the generator's manifest."""
    gateway, url, local, _ = zero3_env
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        expected = open(os.path.join(mnt, "fp32", "model.safetensors"), "rb").read()
    time.sleep(OPS_LOG_SETTLE_S)
    before = len(gateway.ops_log())
    with mounted(ckptfs_bin, url, tmp_path / "mnt") as mnt:
        time.sleep(OPS_LOG_SETTLE_S)
        per_object = {}
        for e in object_gets(gateway, before):
            per_object.setdefault(e["object"].rsplit("/", 1)[-1], []).append(e["bytes_sent"])
        data = open(os.path.join(mnt, "fp32", "model.safetensors"), "rb").read()
    assert data == expected
    assert_matches_generator(local, "fp32/model.safetensors", data)
    optimizer_files = {k: v for k, v in per_object.items() if k.endswith("optim_states.pt")}
    assert len(optimizer_files) == ZERO3_RANKS, per_object
    for name, sizes in optimizer_files.items():
        assert len(sizes) <= 2, (name, sizes)


TAMPERED_BUCKET = "ckptfs-tampered"


def with_local_headers_renamed(src, dest, rank_file):
    """A copy of the checkpoint `src` in which every storage record of `rank_file` names another record in
    its local header (the central directory unchanged), as no torch.save writes it."""
    import zipfile
    shutil.copytree(src, dest)
    path = os.path.join(dest, rank_file)
    data = bytearray(open(path, "rb").read())
    for info in zipfile.ZipFile(path).infolist():
        if "/data/" in info.filename and info.file_size > 0:
            last = info.header_offset + 30 + len(info.filename) - 1
            data[last] = ord("x") if data[last] != ord("x") else ord("y")
    open(path, "wb").write(data)
    return dest


def test_a_local_header_not_where_the_parse_placed_it_fails_its_reads(zero3_env, ckptfs_bin, tmp_path):
    """The s3:// mount places records without reading their local headers: where one is not what torch's
    writer puts there (a record's name altered in it), the reads of its bytes answer EIO and the log names the
    object and the record; the rest of the mount is served, and a mount from the index it wrote checks the
    same. A local source, whose headers are all read at parse, is refused there (exit 4)."""
    gateway, _, local, _ = zero3_env
    rank_file = "global_step3/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    tampered = with_local_headers_renamed(local, tmp_path / "tampered", rank_file)
    gateway.make_bucket(TAMPERED_BUCKET)
    gateway.upload_tree(str(tampered), TAMPERED_BUCKET, "checkpoint")
    url = f"s3://{TAMPERED_BUCKET}/checkpoint"
    refused = run_ckptfs(ckptfs_bin, "inspect", tampered)
    assert refused.returncode == 4 and "names another record" in refused.stderr, refused.stderr
    index = tmp_path / "index"
    for attempt in ("parses", "loads the index"):
        with foreground(ckptfs_bin, url, tmp_path / "mnt", index_cache=index) as proc:
            mnt = tmp_path / "mnt"
            assert read_errno(mnt / "fp32" / "model.safetensors") == errno.EIO, attempt
            assert read_errno(mnt / "model.safetensors") == errno.EIO, attempt
            assert json.loads(open(mnt / "ckptfs.json").read())["framework"], attempt
        log = proc.stderr.read()
        assert f"{url}/{rank_file}" in log and "local header of record" in log, (attempt, log)
        assert ("index loaded" in log) == (attempt == "loads the index"), (attempt, log)


def test_a_random_read_fetches_about_what_it_reads(zero3_env, ckptfs_bin, tmp_path):
    """With prefetch off, a 4 KiB read in the middle of the fp32 view costs the rounded range it reads of
    one or two rank objects and the local header of its record: the header's check is no sequential reader
    (before, it read ahead a whole 8 MiB block of the object and the read fetched up to that block's end)."""
    gateway, url, local, _ = zero3_env
    cache = tmp_path / "index"
    with mounted(ckptfs_bin, url, tmp_path / "warm", index_cache=cache):
        pass
    view = os.path.join("fp32", "model.safetensors")
    with mounted(ckptfs_bin, local, tmp_path / "local") as mnt:
        size = os.path.getsize(os.path.join(mnt, view))
        at = size // 2 // 4096 * 4096
        with open(os.path.join(mnt, view), "rb") as f:
            f.seek(at)
            expected = f.read(4096)
    with mounted(ckptfs_bin, url, tmp_path / "mnt", "-o", "prefetch=0", index_cache=cache) as mnt:
        time.sleep(OPS_LOG_SETTLE_S)
        before = len(gateway.ops_log())
        fd = os.open(os.path.join(mnt, view), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel readahead around the read
            data = os.pread(fd, 4096, at)
        finally:
            os.close(fd)
        time.sleep(OPS_LOG_SETTLE_S)
        gets = object_gets(gateway, before)
    assert data == expected
    assert 1 <= len(gets) <= 4 and sum(e["bytes_sent"] for e in gets) <= 4 * (64 << 10), gets
