"""Issue 19's object-storage bench, run by bench/s3_bench.sh (which checks for root, radosgw and s3fs first;
its header says what each case measures). Numbers are reported, never asserted.

    /usr/bin/python3 bench/s3_bench.py --work DIR --bin CKPTFS [--ranks N] [--dims V,H,F,L]
                                       [--connections N] [--repeat N] [--doc FILE|-]
    /usr/bin/python3 bench/s3_bench.py --from-json docs/s3-bench.json --doc FILE   (the report alone)

The store is mount_tests/s3_gateway.py's radosgw (its Gateway class, imported: the same set-up as the tests).
"""
import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "mount_tests"))
import bench_checkpoint  # noqa: E402
import s3_gateway  # noqa: E402
from s3_delay_proxy import DelayProxy  # noqa: E402

BENCH_CASE = bench_checkpoint.G.BENCH["name"]  # bench_z3_dp64, shared with the other benches
BUCKET = "ckptfs-bench"
PREFIX = "ckpt"
VIEWS = {"fp32": "fp32/model.safetensors", "bf16": "model.safetensors"}
READ_TIMEOUT = 900
OPS_SETTLE_S = 1.5  # the ops log is written a little after each answer: quiet this long = complete


# ---- machine helpers ------------------------------------------------------------------------------------
def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def is_mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def unmount(path):
    if is_mounted(path):
        for cmd in (["fusermount3", "-u", path], ["fusermount3", "-uz", path], ["umount", "-l", path]):
            if subprocess.run(cmd, stderr=subprocess.DEVNULL).returncode == 0:
                return


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def disk_stat_path(path):
    """/proc-style statistics of the block device holding `path` (None where sysfs has none)."""
    dev = os.stat(path).st_dev
    stat = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
    return stat if os.path.exists(stat) else None


def disk_read_bytes(stat):
    """Bytes read from the device so far (sectors read, field 3, are 512 bytes whatever the device)."""
    with open(stat) as f:
        return int(f.read().split()[2]) * 512


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(path) for n in fs)


class Daemon:
    """A FUSE daemon run in the foreground (-f) so that its pid is known (peak RSS); mounted on `mnt`."""

    def __init__(self, bench, name, cmd, mnt, env=None):
        self.name, self.mnt = name, mnt
        unmount(mnt)
        os.makedirs(mnt, exist_ok=True)
        self.log = os.path.join(bench.out, f"{name}.log")
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        bench.daemons.append(self)
        while not is_mounted(mnt):
            if self.proc.poll() is not None:
                raise MountRefused(f"{name} exited with status {self.proc.returncode} before mounting "
                                   f"({self.log_tail()})")
            if time.monotonic() - t0 > 600:
                raise RuntimeError(f"{name} did not mount {mnt} within 600 s")
            time.sleep(0.01)
        self.mount_s = time.monotonic() - t0

    def log_tail(self):
        with open(self.log, errors="replace") as f:
            return " | ".join(f.read().strip().splitlines()[-3:])

    def stop(self):
        """Unmounts; returns the daemon's peak RSS (KiB)."""
        hwm = peak_rss_kib(self.proc.pid) if self.proc.poll() is None else None
        unmount(self.mnt)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return hwm


class MountRefused(RuntimeError):
    pass


def timed_cat(path):
    t0 = time.monotonic()
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True, timeout=READ_TIMEOUT)
    return time.monotonic() - t0


# ---- the checkpoint ----------------------------------------------------------------------------------------
def checkpoint(work, ranks, dims):
    """The bench checkpoint (generate.py's bench model at `ranks` ranks, `dims` or its own dims): case dir."""
    if ranks == bench_checkpoint.G.BENCH["dp"] and dims is None:
        subprocess.run([sys.executable, os.path.join(REPO, "mount_tests/gen/generate.py"),
                        os.path.join(work, "fixtures"), "--only", BENCH_CASE], check=True,
                       stdout=subprocess.DEVNULL)
        return os.path.join(work, "fixtures", BENCH_CASE)
    name = f"bench_z3_dp{ranks}" + ("_" + "x".join(map(str, dims)) if dims else "")
    return bench_checkpoint.make(os.path.join(work, "s3", "fixtures", name), ranks, dims)


# ---- the gateway's ops log: what a case fetched -------------------------------------------------------------
def settled_ops(gateway):
    """The ops log once no entry has come for OPS_SETTLE_S (at most 30 s)."""
    entries, quiet_since, t0 = gateway.ops_log(), time.monotonic(), time.monotonic()
    while time.monotonic() - quiet_since < OPS_SETTLE_S and time.monotonic() - t0 < 30:
        time.sleep(0.25)
        now = gateway.ops_log()
        if len(now) != len(entries):
            entries, quiet_since = now, time.monotonic()
    return entries


def fetched(entries):
    gets = [e for e in entries if e.get("operation") == "get_obj"]
    failed = [e for e in entries if not str(e.get("http_status", "")).startswith("2")]
    return {"requests": len(entries), "gets": len(gets), "get_bytes": sum(int(e.get("bytes_sent", 0)) for e in gets),
            "errors": len(failed),
            "error_samples": [f"{e.get('uri')} {e.get('http_status')} {e.get('error_code', '')}" for e in failed[:5]]}


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin
        self.work = args.work
        self.out = os.path.join(args.work, "s3")
        self.mnt = os.path.join(args.work, "mnt", "s3")
        os.makedirs(self.out, exist_ok=True)
        self.daemons, self.results, self.skipped = [], [], {}
        self.gateway = self.proxy = None
        self.endpoint = self.disk_stat = None

    # -- the store ------------------------------------------------------------------------------------------
    def start_store(self, src):
        self.gateway = s3_gateway.Gateway()
        self.gateway.start()
        self.gateway.make_bucket(BUCKET)
        t0 = time.monotonic()
        self.keys = sorted(self.gateway.upload_tree(src, BUCKET, PREFIX))
        # The store's disk: its reads per case show what the gateway read to answer (its read-ahead included).
        self.disk_stat = disk_stat_path(self.gateway.host_root)
        self.upload_s = time.monotonic() - t0
        self.object_bytes = tree_bytes(src)

    def warm_up(self):
        """One download of every object to /dev/null, cold and not reported, before the first case: every
        client meets a gateway that has served each object once (its metadata and database pages, its
        threads), and nothing is written to disk after the upload. (The first case, (a) fp32 over loopback,
        was still the slowest (a) of the run, its mount 0.6 s where the others' took 0.3 s: not explained.)
        Returns its seconds."""
        self.configure(None)
        drop_caches()
        return self.download(None)

    def configure(self, delay_ms):
        """Clients reach the gateway directly (None) or through the relay, which delays each request."""
        if self.proxy:
            self.proxy.close()
            self.proxy = None
        if delay_ms is not None:
            self.proxy = DelayProxy(self.gateway.port, delay_ms / 1000)
            self.endpoint = self.proxy.endpoint
        else:
            self.endpoint = self.gateway.endpoint

    def client_env(self):
        env = dict(os.environ)
        env.update(self.gateway.env())
        env["AWS_ENDPOINT_URL"] = self.endpoint
        return env

    def measure(self, config, case, run, repetition):
        """Runs `run` (returns a dict of its own figures) cold: caches dropped, the ops log marked."""
        drop_caches()
        before = len(settled_ops(self.gateway))
        disk_before = disk_read_bytes(self.disk_stat) if self.disk_stat else None
        row = {"config": config, "case": case, "run": repetition}
        try:
            row.update(run())
        except MountRefused as e:
            self.skipped[case] = str(e)
            print(f"  {config:12} {case:9} skipped: {e}", flush=True)
            return None
        row.update(fetched(settled_ops(self.gateway)[before:]))
        if disk_before is not None:
            row["disk_read_bytes"] = disk_read_bytes(self.disk_stat) - disk_before
        self.results.append(row)
        print(f"  {repetition} {config:12} {case:9} {row['seconds']:8.2f} s  GET {row['get_bytes']:>12} B in {row['gets']:5} "
              f"requests ({row['requests']} in all, {row['errors']} not 2xx)  peak RSS {row.get('rss_kib', {})} KiB", flush=True)
        return row

    def fetched_since(self, before):
        """What the mount fetched (listing, parsing), apart from the read; the wait is outside both times."""
        mount = fetched(settled_ops(self.gateway)[before:])
        return {"mount_get_bytes": mount["get_bytes"], "mount_requests": mount["requests"]}

    # -- (a) ckptfs on s3:// ---------------------------------------------------------------------------------
    def mount_s3(self):
        """ckptfs on s3://; a binary without -o s3_connections (issue 19's pool, a later step) mounts without it."""
        opts = [f"endpoint={self.endpoint}", "s3_path_style", "index_cache=off",
                f"s3_connections={self.args.connections}"]
        opts += [o for o in os.environ.get("CKPTFS_S3_OPTS", "").split(",") if o]
        while True:
            try:
                return Daemon(self, "ckptfs-s3", [self.bin, f"s3://{BUCKET}/{PREFIX}", self.mnt, "-f", "-o",
                                                  ",".join(opts)], self.mnt, self.client_env()), opts
            except MountRefused as e:
                pool = [o for o in opts if o.startswith("s3_connections=")]
                if not pool or "unknown option" not in str(e) or pool[0] not in str(e):
                    raise
                opts.remove(pool[0])

    def case_a(self, view):
        def run():
            before = len(settled_ops(self.gateway))
            d, opts = self.mount_s3()
            file = os.path.join(self.mnt, VIEWS[view])
            size = os.path.getsize(file)
            mount = self.fetched_since(before)
            read_s = timed_cat(file)
            return {"seconds": d.mount_s + read_s, "mount_s": d.mount_s, "read_s": read_s, "view_bytes": size,
                    "rss_kib": {"ckptfs": d.stop()}, "options": ",".join(opts), **mount}
        return run

    # -- (b) download every object, then export or mount locally ----------------------------------------------
    def download(self, dest):
        """Every object into `dest` (None: to /dev/null, nothing written); returns its seconds."""
        if dest:
            shutil.rmtree(dest, ignore_errors=True)
        cfg = os.path.join(self.out, "curl.cfg")
        with open(cfg, "w") as f:
            for key in self.keys:
                out = os.path.join(dest, os.path.relpath(key, PREFIX)) if dest else os.devnull
                f.write(f'url = "{self.endpoint}/{BUCKET}/{key}"\noutput = "{out}"\n')
        g = self.gateway
        t0 = time.monotonic()
        subprocess.run(["curl", "-sS", "--no-progress-meter", "--fail", "--create-dirs", "--parallel", "--parallel-max",
                        str(self.args.connections), "--aws-sigv4", f"aws:amz:{g.region}:s3", "--user",
                        f"{g.access_key}:{g.secret_key}", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                        "-K", cfg], check=True, timeout=READ_TIMEOUT)
        s = time.monotonic() - t0
        got = tree_bytes(dest) if dest else self.object_bytes
        if got != self.object_bytes:
            raise RuntimeError(f"downloaded {got} bytes into {dest}, the store holds {self.object_bytes}")
        return s

    def case_b_export(self):
        def run():
            dest, out = os.path.join(self.out, "download"), os.path.join(self.out, "export")
            download_s = self.download(dest)
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            rss_file = os.path.join(self.out, "export.rss")
            t0 = time.monotonic()
            subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file, self.bin, "export", dest, out], check=True,
                           stdout=subprocess.DEVNULL, timeout=READ_TIMEOUT)
            export_s = time.monotonic() - t0
            with open(rss_file) as f:
                rss = int(f.read().split()[-1])
            return {"seconds": download_s + export_s, "download_s": download_s, "export_s": export_s,
                    "view_bytes": tree_bytes(out), "rss_kib": {"ckptfs export": rss}}
        return run

    def case_b_read(self, view):
        """Download, then a local mount and a read of the view: the least a download-first user pays."""
        def run():
            dest = os.path.join(self.out, "download")
            download_s = self.download(dest)
            d = Daemon(self, "ckptfs-local", [self.bin, dest, self.mnt, "-f", "-o", "index_cache=off"], self.mnt)
            file = os.path.join(self.mnt, VIEWS[view])
            size = os.path.getsize(file)
            read_s = timed_cat(file)
            return {"seconds": download_s + d.mount_s + read_s, "download_s": download_s, "mount_s": d.mount_s,
                    "read_s": read_s, "view_bytes": size, "rss_kib": {"ckptfs": d.stop()}}
        return run

    # -- (c) s3fs, ckptfs on top ---------------------------------------------------------------------------------
    def case_c(self, view):
        def run():
            g = self.gateway
            passwd = os.path.join(self.out, "s3fs.passwd")
            with open(os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(f"{g.access_key}:{g.secret_key}\n")
            lower = os.path.join(self.work, "mnt", "s3fs")
            before = len(settled_ops(self.gateway))
            t0 = time.monotonic()
            s3fs = Daemon(self, "s3fs", ["s3fs", f"{BUCKET}:/{PREFIX}", lower, "-f", "-o",
                                         f"url={self.endpoint},use_path_request_style,passwd_file={passwd},"
                                         f"endpoint={g.region},sigv4,parallel_count={self.args.connections}"],
                          lower)
            ck = Daemon(self, "ckptfs-on-s3fs", [self.bin, lower, self.mnt, "-f", "-o", "index_cache=off"], self.mnt)
            mount_s = time.monotonic() - t0
            file = os.path.join(self.mnt, VIEWS[view])
            size = os.path.getsize(file)
            mount = self.fetched_since(before)
            read_s = timed_cat(file)
            rss = {"ckptfs": ck.stop()}
            rss["s3fs"] = s3fs.stop()
            return {"seconds": mount_s + read_s, "mount_s": mount_s, "read_s": read_s, "view_bytes": size,
                    "rss_kib": rss, **mount}
        return run

    def close(self):
        for d in reversed(self.daemons):
            if d.proc.poll() is None:
                d.stop()
        if self.proxy:
            self.proxy.close()
        if self.gateway:
            self.gateway.close()


# ---- report -------------------------------------------------------------------------------------------------
RATIOS = (  # name, heading, target (operator, value) or None
    ("a_fetched_over_needed", "(a) fp32: fetched / needed", ("<=", 1.05)),
    ("a_bf16_fetched_over_needed", "(a) bf16: fetched / needed", ("<=", 1.05)),
    ("a_vs_b_end_to_end_fp32", "(b export) s / (a fp32) s", (">=", 2.0)),
    ("a_rate_vs_b_download_rate", "(a fp32) GB/s fetched / (b) download GB/s", (">=", 0.8)),
    ("a_read_rate_vs_b_download_rate", "(a fp32) read alone: GB/s fetched / (b) download GB/s", None),
    ("a_disk_rate_vs_b_disk_rate", "(a fp32) store disk read MB/s / (b) download's", None),
    ("a_vs_c_fp32", "(c fp32) s / (a fp32) s", (">", 1.0)),
    ("c_fetched_over_needed", "(c) fp32: fetched / needed", None))


def run_ratios(by, config, run, needed):
    """The issue's ratios of one repetition of a config, each case against the same repetition's others
    (None where a side was not measured)."""
    a, a16 = by.get((config, "a fp32", run)), by.get((config, "a bf16", run))
    b, c = by.get((config, "b export", run)), by.get((config, "c fp32", run))
    return {
        "a_fetched_over_needed": a and a["get_bytes"] / needed,
        "a_bf16_fetched_over_needed": a16 and a16["get_bytes"] / needed,
        "a_vs_b_end_to_end_fp32": a and b and b["seconds"] / a["seconds"],
        "a_rate_vs_b_download_rate": a and b and fetch_rate(a) / fetch_rate(b),
        "a_read_rate_vs_b_download_rate": a and b and read_fetch_rate(a) / fetch_rate(b),
        "a_disk_rate_vs_b_disk_rate": a and b and "disk_read_bytes" in a and "disk_read_bytes" in b and (
            a["disk_read_bytes"] / a["seconds"]) / (b["disk_read_bytes"] / b["download_s"]),
        "a_vs_c_fp32": a and c and c["seconds"] / a["seconds"],
        "c_fetched_over_needed": c and c["get_bytes"] / needed}


def ratios(rows, needed):
    """Per config, each ratio's median over the repetitions (paired within a repetition, so that a drift of
    the machine cancels) and its range: {config: {name: {"median", "min", "max"} or None}}."""
    by = {(r["config"], r["case"], r.get("run", 1)): r for r in rows}
    out = {}
    for config in dict.fromkeys(r["config"] for r in rows):
        runs = sorted({r.get("run", 1) for r in rows if r["config"] == config})
        per_run = [run_ratios(by, config, run, needed) for run in runs]
        out[config] = {}
        for name, _, _ in RATIOS:
            values = [q[name] for q in per_run if q[name] is not None]
            out[config][name] = ({"median": statistics.median(values), "min": min(values), "max": max(values)}
                                 if values else None)
    return out


def median_rows(rows):
    """One row per (config, case): its median repetition by seconds (the lower middle of an even count),
    with every repetition's seconds in "runs_s", in run order."""
    groups = {}
    for r in rows:
        groups.setdefault((r["config"], r["case"]), []).append(r)
    out = []
    for group in groups.values():
        by_seconds = sorted(group, key=lambda r: r["seconds"])
        out.append({**by_seconds[(len(group) - 1) // 2], "runs_s": [r["seconds"] for r in group]})
    return out


def fetch_rate(row):
    """GB/s of the bytes fetched, over the download (b) or the whole case (a, c)."""
    return row["get_bytes"] / row.get("download_s", row["seconds"]) / 1e9


def read_fetch_rate(row):
    """GB/s of the bytes (a) fetched after its mount (listing and parsing apart), over the read alone."""
    return (row["get_bytes"] - row.get("mount_get_bytes", 0)) / row["read_s"] / 1e9


def verdict(target, value):
    if target is None or value is None:
        return "" if target is None else "not measured"
    op, t = target
    ok = value <= t if op == "<=" else value >= t if op == ">=" else value > t
    return "met" if ok else "**not met**"


def table(rows, needed):
    """The median rows (median_rows), one line each."""
    lines = ["| config | case | seconds | runs (s) | mount s | download s | read / export s | view bytes "
             "| bytes fetched (GET) | GETs | requests | fetched / needed | GB/s fetched | store disk read (MB) "
             "| peak RSS (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda r, k: f"{r[k]:.2f}" if k in r else "—"  # noqa: E731
    for r in rows:
        rss = ", ".join(f"{k} {v / 1024:.0f}" for k, v in r["rss_kib"].items() if v)
        got = f"{r['get_bytes']:,}"
        errors = f" ({r['errors']} not 2xx)" if r.get("errors") else ""
        if "mount_get_bytes" in r:
            got += f" (mount: {r['mount_get_bytes']:,} in {r['mount_requests']} requests)"
        runs = ", ".join(f"{x:.2f}" for x in r["runs_s"])
        disk = f"{r['disk_read_bytes'] / 1e6:,.0f}" if "disk_read_bytes" in r else "—"
        lines.append(f"| {r['config']} | {r['case']} | {r['seconds']:.2f} | {runs} | {f(r, 'mount_s')} | "
                     f"{f(r, 'download_s')} | {r.get('read_s', r.get('export_s', 0)):.2f} | {r['view_bytes']:,} | "
                     f"{got} | {r['gets']} | {r['requests']}{errors} | {r['get_bytes'] / needed:.2f} | "
                     f"{fetch_rate(r):.2f} | {disk} | {rss} |")
    return lines


def ratio_table(q):
    lines = ["| config | " + " | ".join(h for _, h, _ in RATIOS) + " |", "|---|" + "---|" * len(RATIOS),
             "| target | " + " | ".join(f"{t[0]} {t[1]}" if t else "" for _, _, t in RATIOS) + " |"]
    for config, vals in q.items():
        cells = []
        for name, _, target in RATIOS:
            v = vals[name]
            if v is None:
                cells.append("—")
                continue
            low, high = f"{v['min']:.2f}", f"{v['max']:.2f}"
            spread = f" [{low}–{high}]" if low != high else ""
            cells.append(f"{v['median']:.2f}{spread}" + (f" ({verdict(target, v['median'])})" if target else ""))
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return lines


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = list(dict.fromkeys(r["config"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    by = {(r["config"], r["case"]): r["seconds"] for r in rows}
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        xs = [k + i * width for k in range(len(cases))]
        ax.bar(xs, [by.get((config, c), 0) for c in cases], width, label=config)
    ax.set_xticks([k + width * (len(configs) - 1) / 2 for k in range(len(cases))], cases)
    ax.set_ylabel("seconds (end to end, cold; median run)")
    ax.set_title("Checkpoint on object storage: ckptfs on s3:// (a), download first (b), s3fs + ckptfs (c)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_all(args):
    """Every configuration and case; returns the results (facts, rows, what was skipped)."""
    t_start = time.time()
    case_dir = checkpoint(args.work, args.ranks, args.dims)
    src = os.path.join(case_dir, "checkpoint")
    with open(os.path.join(case_dir, "case.json")) as f:
        needed = json.load(f)["fp32_master_bytes"]  # what every merged view here is made from
    bench = Bench(args)
    version = subprocess.run([args.bin, "--version"], capture_output=True, text=True).stdout.strip()
    facts = {"command": args.command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "nproc": os.cpu_count(), "loadavg_start": loadavg(), "checkpoint": src, "ranks": args.ranks,
             "connections": args.connections, "delay_ms": args.delay_ms, "repeat": args.repeat,
             "fp32_master_bytes": needed,
             "binary": args.bin, "binary_version": version}
    try:
        bench.start_store(src)
        facts.update(objects=len(bench.keys), object_bytes=bench.object_bytes, upload_s=round(bench.upload_s, 1))
        print(f"store: {len(bench.keys)} objects, {bench.object_bytes} bytes uploaded in {bench.upload_s:.1f} s; "
              f"the views need {needed} bytes (fp32 masters)", flush=True)
        facts.update(warm_up_s=round(bench.warm_up(), 1))
        print(f"warm-up: every object downloaded once in {facts['warm_up_s']} s (not reported)", flush=True)
        a_works = True
        # the relay itself costs CPU (2 more loopback hops per byte): "relay +0 ms" isolates the delay's effect
        configs = (("loopback", None), ("relay +0 ms", 0), (f"relay +{args.delay_ms:g} ms", args.delay_ms))
        # Repetition after repetition of every configuration, not one configuration's repetitions in a row: a
        # drift of the machine (the gateway's first ranged reads are slower than its later ones) then falls on
        # every configuration alike.
        for repetition in range(1, args.repeat + 1):
            for config, delay in configs:
                bench.configure(delay)
                for view in VIEWS:
                    if a_works and bench.measure(config, f"a {view}", bench.case_a(view), repetition) is None:
                        a_works = False  # the binary refuses s3://: not retried
                bench.measure(config, "b export", bench.case_b_export(), repetition)
                bench.measure(config, "b fp32", bench.case_b_read("fp32"), repetition)
                for view in VIEWS:
                    bench.measure(config, f"c {view}", bench.case_c(view), repetition)
    finally:
        bench.close()
    facts.update(loadavg_end=loadavg(), bench_s=round(time.time() - t_start))
    return {"facts": facts, "results": bench.results, "ratios": ratios(bench.results, needed),
            "skipped": bench.skipped}


def warm_up_text(facts):
    if "warm_up_s" not in facts:  # a JSON of a run before the warm-up
        return "no warm-up"
    return f"a warm-up download of every object ({facts['warm_up_s']} s) before the first case, not reported"


def repetitions_text(facts):
    n = facts.get("repeat", 1)  # a JSON of a run before repetitions: one
    if n == 1:
        return "Each case run once."
    return (f"Each case run {n} times, repetition after repetition of every configuration; a row is the case's "
            "median run (by seconds), its runs' seconds beside it in run order.")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def report(result, doc_path):
    """Prints the tables; writes the page (and its JSON and plot beside it) unless doc_path is "-"."""
    facts, rows = result["facts"], result["results"]
    result["ratios"] = ratios(rows, facts["fp32_master_bytes"])  # a JSON of an earlier run gets the new ones
    medians = median_rows(rows)
    lines = (table(medians, facts["fp32_master_bytes"]) +
             ["", "The issue's targets (each the median over the repetitions of the ratio within a repetition, "
              "[its range]):", ""] + ratio_table(result["ratios"]))
    print("\n".join(lines))
    skipped = [f"{case}: {why}" for case, why in result["skipped"].items()]
    for s in skipped:
        print(f"(a) not measured: {s}")
    if doc_path == "-":
        return
    base = os.path.splitext(doc_path)[0]
    has_a = any(r["case"].startswith("a ") for r in rows)
    if has_a:
        plot(medians, base + ".png")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    doc = ["# Object-storage bench (issue 19)", "", "Generated by", "", "```", facts["command"], "```", "",
           f"on {facts['date']} (bench/s3_bench.sh's header says what each case does): {facts['nproc']} CPUs, load "
           f"average {facts['loadavg_start']} at the start, {facts['loadavg_end']} at the end; {facts['bench_s']} s "
           f"in all; `{facts['binary_version']}`. Checkpoint: {facts['ranks']} ranks, {facts['objects']} objects, "
           f"{facts['object_bytes']:,} bytes in the store; every view is made from the "
           f"{facts['fp32_master_bytes']:,} bytes of fp32 masters (\"needed\"). {facts['connections']} parallel "
           f"connections for every client; {warm_up_text(facts)}. {repetitions_text(facts)} Bytes fetched and "
           "requests: the gateway's ops log; store disk read: the reads of the block device under the gateway's "
           "store over the case (its read-ahead included; other files on that device too). One run, numbers "
           "never asserted; on 2 CPUs the gateway, the relay, the clients and ckptfs share the cores with whatever "
           "else runs (see the load average), so single figures are noisy.", ""]
    doc += lines
    if skipped:
        doc += ["", "(a) not measured: " + "; ".join(skipped)]
    if has_a:
        doc += ["", f"![s3 bench]({os.path.basename(base)}.png)"]
    doc += ["", f"Raw figures: [{os.path.basename(base)}.json]({os.path.basename(base)}.json)."]
    with open(doc_path, "w") as f:
        f.write("\n".join(doc) + "\n")
    print(f"wrote {doc_path}, {base}.json" + (f" and {base}.png" if has_a else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="the bench's WORKDIR (mounts, download, export, the generated checkpoint)")
    ap.add_argument("--bin", help="the ckptfs binary")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--dims", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="vocab,hidden,ffn,layers of the bench model (default: generate.py's BENCH_DIMS)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs of every case (the report gives their median)")
    ap.add_argument("--doc", default="-", help="markdown page to write (table, facts, targets); - for none")
    ap.add_argument("--command", default="bash bench/s3_bench.sh")
    ap.add_argument("--from-json", metavar="FILE", help="no measuring: the report of an earlier run's JSON")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
    else:
        if not (args.work and args.bin):
            ap.error("--work and --bin are needed to measure")
        result = measure_all(args)
        path = os.path.join(args.work, "s3", "results.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"results: {path}; {result['facts']['bench_s']} s in all")
    report(result, args.doc)


if __name__ == "__main__":
    main()
