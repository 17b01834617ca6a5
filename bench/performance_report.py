#!/usr/bin/env python3
"""The report of one bench/run_all.sh run: reads RUN_DIR/records.tsv (the raw numbers every bench recorded
with `record`, bench/lib_bench.sh, and run_all's machine facts and exit statuses) and writes the markdown page
(how it was made, the machine, a table of ratios against the baselines measured in the same run, the targets
met or not) and its PNG plots next to it (PAGE's folder, performance-*.png).

    /usr/bin/python3 bench/performance_report.py RUN_DIR docs/performance.md

RUN_DIR: WORKDIR/run_all. Every figure on the page comes from the records; nothing is typed in. Needs
python3-matplotlib (Agg backend, no display)."""
import collections
import csv
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FP32 = "fp32/model.safetensors"
MODEL = "model.safetensors"
# The targets (performance issue, item 5), reported, never asserted.
T_COLD, T_LATENCY, T_LOADER, T_WARM_FP32, T_WARM_BF16 = 0.8, 0.5, 0.7, 0.4, 0.3
BENCHES = ["mount_bench", "export_bench", "universal_bench", "loader_bench", "dcp_bench", "cold_read_bench",
           "zero_to_fp32_bench", "megatron_bench", "fsdp_local_bench", "gguf_bench", "rank_sweep", "latency_bench", "scale_bench"]
SWEEP_CASES = ["scale_z3_dp8", "scale_z3_dp64", "scale_z3_dp512", "scale_z3_dp1024"]


class Records:
    def __init__(self, path):
        self.d = collections.defaultdict(list)
        with open(path, newline="") as f:
            for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                if len(row) >= 3:
                    self.d[(row[0], row[1])].append((row[2], row[3] if len(row) > 3 else ""))

    def has(self, bench, key):
        return (bench, key) in self.d

    def s(self, bench, key, default=None):
        v = self.d.get((bench, key))
        return v[-1][0] if v else default

    def note(self, bench, key):
        v = self.d.get((bench, key))
        return v[-1][1] if v else ""

    def f(self, bench, key):
        """the last value recorded under key, as a float; KeyError when there is none"""
        v = self.d.get((bench, key))
        if not v:
            raise KeyError(f"{bench}: {key}")
        return float(v[-1][0])

    def keys(self, bench):
        return [k for (b, k) in self.d if b == bench]


def short_view(view):
    return {MODEL: "bf16", FP32: "fp32", "fp32/pytorch_model.bin": "fp32 .bin"}.get(view, view)


def gbs(nbytes, s):
    return nbytes / s / 1e9


def fmt_gbs(x):
    return f"{x:.2f} GB/s"


def fmt_s(x):
    return f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def median(xs):
    return statistics.median(xs)


class Report:
    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.r = Records(os.path.join(run_dir, "records.tsv"))
        self.rows = []   # (group, what, ckptfs, baseline, ratio, target, note)
        self.plot_data = {}
        self.missing = []  # (group, what, why)

    # ---- bench status ------------------------------------------------------------------------------------
    def status(self, bench):
        rc = self.r.s("run_all", f"bench.{bench}.rc")
        if rc is None:
            return "not run"
        if rc == "skipped":
            return self.r.note("run_all", f"bench.{bench}.rc") or "skipped"
        if rc == "0":
            return "ok"
        if rc == "124":
            return f"timed out (rc 124, {self.r.note('run_all', f'bench.{bench}.rc')})"
        return f"failed (rc {rc})"

    def log_tail(self, bench, n=6):
        try:
            with open(os.path.join(self.run_dir, f"{bench}.log"), errors="replace") as f:
                lines = [ln.rstrip() for ln in f if ln.strip()]
            return lines[-n:]
        except OSError:
            return []

    # ---- rows --------------------------------------------------------------------------------------------
    def row(self, group, what, ck, base, ratio, target=None, note=""):
        self.rows.append((group, what, ck, base, ratio, target, note))

    def section(self, bench, fn):
        """runs fn (which adds rows); a missing record (bench failed, skipped) becomes one placeholder row"""
        try:
            fn()
        except (KeyError, ValueError, ZeroDivisionError) as e:
            st = self.status(bench)
            why = f"no figures: {bench} {st}" if st != "ok" else f"no figures ({e})"
            self.row(bench, why, "—", "—", None, None, "")

    def masters(self):
        return self.r.f("run_all", "bench_z3_dp64.fp32_master_bytes")

    def mount_bench(self):
        r, b, m = self.r, "mount_bench", self.masters()
        cat = gbs(r.f(b, "shard_bytes"), r.f(b, "cat_shards_s"))
        pd = self.plot_data.setdefault("warm", {"cat": cat})
        for view, target in ((FP32, T_WARM_FP32), (MODEL, T_WARM_BF16)):
            vb = r.f(b, f"ckptfs.{view}.bytes")
            one, four, again = (r.f(b, f"ckptfs.{view}.{k}_s") for k in ("first1", "first4", "reread"))
            conv = "fp32 -> bf16" if view == MODEL else "no conversion"
            pd[view] = {"first1": gbs(m, one), "first4": gbs(m, four), "reread_view": gbs(vb, again),
                        "first1_view": gbs(vb, one), "first4_view": gbs(vb, four)}
            self.row("warm reads (mount_bench)", f"`{view}` ({conv}), 1 reader (cat, best of 3 fresh mounts), sources in the page cache",
                     f"{fmt_gbs(gbs(m, one))} ({fmt_s(one)})", f"cat of the shards {fmt_gbs(cat)}",
                     gbs(m, one) / cat, target,
                     f"source-bytes basis; by the view's own {vb / 1e9:.2f} GB: {gbs(vb, one) / cat:.2f}")
            fill = r.f(b, f"fresh_memory.{view}.fill_s")
            self.row("warm reads (mount_bench)",
                     f"`{view}`, 1 reader, against writing as many bytes into newly allocated memory "
                     "(the mount's page cache is such memory; cat reuses one buffer)",
                     f"{fmt_gbs(gbs(vb, one))} ({fmt_s(one)})",
                     f"dd /dev/zero to a new /dev/shm file {fmt_gbs(gbs(vb, fill))} ({fmt_s(fill)})",
                     fill / one, None, "view bytes; time ratio (tmpfs also zeroes each new page)")
            self.row("warm reads (mount_bench)", f"`{view}`, 4 readers (dd, a quarter each)",
                     f"{fmt_gbs(gbs(m, four))} ({fmt_s(four)})", f"cat of the shards {fmt_gbs(cat)}",
                     gbs(m, four) / cat, None, f"by the view's bytes: {gbs(vb, four) / cat:.2f}")
            for readers, k in ((1, one), (4, four)):
                pt = r.f(b, f"passthrough_ll.ra1024.readers{readers}.first_gbs")
                self.row("warm reads (mount_bench)",
                         f"`{view}`, {readers} reader(s), against libfuse's passthrough_ll (read_ahead_kb 1024)",
                         fmt_gbs(gbs(vb, k)), f"passthrough_ll first read of the shards {fmt_gbs(pt)}",
                         gbs(vb, k) / pt, None, "view bytes / s against shard bytes / s")
            self.row("warm reads (mount_bench)", f"`{view}` re-read (kernel page cache of the mount)",
                     fmt_gbs(gbs(vb, again)), f"cat of the shards {fmt_gbs(cat)}", gbs(vb, again) / cat, None,
                     "view bytes / s, best of 3")
        pd["pt1"] = r.f(b, "passthrough_ll.ra1024.readers1.first_gbs")
        pd["pt4"] = r.f(b, "passthrough_ll.ra1024.readers4.first_gbs")

    def cold_read(self):
        r, b, m = self.r, "cold_read_bench", self.masters()
        shard_bytes = r.f(b, "shard_bytes")
        reps = sorted({int(k.split(".")[0][3:]) for k in r.keys(b) if k.startswith("rep") and k.endswith("cat_shards_s")})
        if not reps:
            raise KeyError("cold_read_bench: no reps")
        pd = self.plot_data.setdefault("cold", {})
        for pf in (32, 0, 128):
            for view in (FP32, MODEL):
                vb = r.f(b, f"{view}.bytes")
                disks, cks, ratios, secs = [], [], [], []
                for rep in reps:
                    disk = gbs(shard_bytes, r.f(b, f"rep{rep}.cat_shards_s"))
                    s = r.f(b, f"rep{rep}.prefetch{pf}.{view}.s")
                    disks.append(disk)
                    cks.append(gbs(m, s))
                    secs.append(s)
                    ratios.append(gbs(m, s) / disk)
                if pf == 32:
                    pd[view] = {"ck": median(cks), "disk": median(disks)}
                    pd["disk"] = median(disks)
                self.row("cold first read (cold_read_bench)",
                         f"`{view}`, prefetch={pf}{' (the default)' if pf == 32 else ''}, caches dropped",
                         f"{fmt_gbs(median(cks))} (s: {', '.join(f'{x:.2f}' for x in secs)})",
                         f"disk: cat of the {shard_bytes / 1e9:.2f} GB of shards {fmt_gbs(median(disks))}",
                         median(ratios), T_COLD if pf == 32 else None,
                         f"median of {len(reps)} reps, each against its own cat; by the view's bytes: "
                         f"{median([gbs(vb, s) / d for s, d in zip(secs, disks)]):.2f}")

    def latency(self):
        r, b, m = self.r, "latency_bench", self.masters()
        runs = collections.defaultdict(list)   # (where, what) -> [(rep, s, bytes)]
        # latency_bench.sh records "rep<N>.<where>.cat_shards.s" and "rep<N>.<where>.prefetch<P>.<view>.s", the
        # seconds, with the bytes read first in the note ("<bytes> bytes; ...")
        for k in r.keys(b):
            parts = k.split(".", 3)
            if len(parts) == 4 and parts[0].startswith("rep") and k.endswith(".s") and "_split" not in parts[2]:
                rep, where, what = int(parts[0][3:]), parts[1], parts[2]
                what = "cat of the shards" if what == "cat_shards" else "ckptfs prefetch=" + what[len("prefetch"):]
                for s_, note in r.d[(b, k)]:
                    runs[(where, what)].append((rep, float(s_), float(note.split()[0])))
        source = "records"
        if not runs:  # a latency_bench.sh without the record lines: its own results file (same run)
            path = os.path.join(os.path.dirname(self.run_dir), "latency-bench.results")
            if self.status(b) == "ok" and os.path.exists(path):
                with open(path) as f:
                    for line in f:
                        fld = line.rstrip("\n").split("|")
                        runs[(fld[1], fld[2])].append((int(fld[0]), float(fld[4]), float(fld[5])))
                source = "WORKDIR/latency-bench.results"
        if not runs:
            raise KeyError("latency_bench: no runs")
        notes = " ".join(n for k in r.keys(b) for _, n in r.d[(b, k)])
        us = notes.split("DELAY_US=", 1)[1].split()[0].rstrip(",;") if "DELAY_US=" in notes else "?"
        delay = f"{us} us per read request"
        pd = self.plot_data.setdefault("latency", {})
        for where, what, target in (("slow", "ckptfs prefetch=32", T_LATENCY), ("slow", "ckptfs prefetch=0", None),
                                    ("slow", "ckptfs prefetch=128", None), ("local", "ckptfs prefetch=32", None)):
            cat = {rep: gbs(nb, s) for rep, s, nb in runs[(where, "cat of the shards")]}
            ck = {rep: (s, nb) for rep, s, nb in runs[(where, what)]}
            reps = sorted(set(cat) & set(ck))
            if not reps:
                continue
            ratios = [gbs(m, ck[x][0]) / cat[x] for x in reps]
            cks = [gbs(m, ck[x][0]) for x in reps]
            pd[(where, what)] = (median(cks), median([cat[x] for x in reps]))
            label = f"slow storage ({delay})" if where == "slow" else "local disk (no added latency)"
            self.row("cold read, added latency (latency_bench)",
                     f"`{FP32}`, {what}{' (the default)' if what.endswith('=32') else ''}, {label}",
                     f"{fmt_gbs(median(cks))} (s: {', '.join(f'{ck[x][0]:.2f}' for x in reps)})",
                     f"cat of the shards through the same storage {fmt_gbs(median([cat[x] for x in reps]))}",
                     median(ratios), target,
                     f"median of {len(reps)} reps; by the view's bytes: "
                     f"{median([gbs(ck[x][1], ck[x][0]) / cat[x] for x in reps]):.2f}"
                     + ("" if source == "records" else f"; from {source}"))

    def loader(self):
        r, b = self.r, "loader_bench"
        combos = sorted({k.rsplit(".", 1)[0] for k in r.keys(b) if k.endswith(".mount_cold_s")},
                        key=lambda c: (c.split(".")[0] != "torch_load", c))
        if not combos:
            raise KeyError("loader_bench: no rows")
        pd = self.plot_data.setdefault("loader", {})
        for state in ("cold", "warm"):
            for c in combos:
                loader, rest = c.split(".", 1)
                view, thr = rest.rsplit(".threads", 1)
                nb = r.f(b, f"{c}.bytes")
                mnt, exp = r.f(b, f"{c}.mount_{state}_s"), r.f(b, f"{c}.export_{state}_s")
                pd[(state, loader, view, int(thr))] = (gbs(nb, mnt), gbs(nb, exp))
                self.row(f"loaders, {state} (loader_bench)", f"{loader} `{view}`, {thr} thread(s)",
                         f"{fmt_gbs(gbs(nb, mnt))} on the mount", f"{fmt_gbs(gbs(nb, exp))} on the exported file",
                         exp / mnt, T_LOADER if state == "cold" else None,
                         "caches dropped, fresh mount" if state == "cold" else "best of 2, right after")

    def zero_to_fp32(self):
        r, b = self.r, "zero_to_fp32_bench"
        st = self.status(b)
        if st != "ok" and not r.has(b, "zero_to_fp32.warm.s"):
            self.row("against DeepSpeed's zero_to_fp32.py (zero_to_fp32_bench)", st, "—", "—", None, None, "")
            return
        pd = self.plot_data.setdefault("zf", {})
        interp = r.note(b, "interpreter")
        for state in ("cold", "warm"):
            zf = r.f(b, f"zero_to_fp32.{state}.s")
            zrss = r.f(b, f"zero_to_fp32.{state}.rss_kib")
            ex = r.f(b, f"export.{state}.s")
            cp = r.f(b, f"mount_cp.{state}.s")
            mc = r.f(b, f"mount_cat.{state}.mount_s") + r.f(b, f"mount_cat.{state}.cat_s")
            pd[state] = {"zero_to_fp32.py": (zf, zrss), "ckptfs export (every view)": (ex, r.f(b, f"export.{state}.rss_kib")),
                         "mount + cp fp32/pytorch_model.bin": (cp, r.f(b, f"mount_cp.{state}.hwm_kib")),
                         f"mount + cat {FP32}": (mc, r.f(b, f"mount_cat.{state}.hwm_kib"))}
            base = f"zero_to_fp32.py {fmt_s(zf)}, peak RSS {zrss / 1024:.0f} MiB"
            g = f"against DeepSpeed's zero_to_fp32.py, {state} (zero_to_fp32_bench)"
            self.row(g, f"`ckptfs export` (every view: {r.f(b, 'export.bytes') / 1e9:.2f} GB written against "
                        f"{r.f(b, 'zero_to_fp32.bytes') / 1e9:.2f} GB)",
                     f"{fmt_s(ex)}, peak RSS {r.f(b, f'export.{state}.rss_kib') / 1024:.0f} MiB", base, zf / ex, None,
                     "time ratio: zero_to_fp32's seconds / ckptfs's")
            self.row(g, f"mount + `cp fp32/pytorch_model.bin` (the same kind of file zero_to_fp32 writes; "
                        f"{r.f(b, 'mount_cp.bytes') / 1e9:.2f} GB against its {r.f(b, 'zero_to_fp32.bytes') / 1e9:.2f} GB, "
                        "which stores the tied head.weight once)",
                     f"{fmt_s(cp)}, daemon peak RSS {r.f(b, f'mount_cp.{state}.hwm_kib') / 1024:.0f} MiB", base,
                     zf / cp, None, "time ratio")
            self.row(g, f"mount + first read of `{FP32}` (cat > /dev/null)",
                     f"{fmt_s(mc)}, daemon peak RSS {r.f(b, f'mount_cat.{state}.hwm_kib') / 1024:.0f} MiB", base,
                     zf / mc, None, "time ratio")
        nd = r.s(b, "check_n_differ")
        self.zf_check = ("zero_to_fp32's pytorch_model.bin and the mount's fp32/pytorch_model.bin: "
                         + ("same keys, dtypes, shapes and values" if nd == "0" else f"{nd} tensor(s) differ: "
                            f"{r.note(b, 'check_n_differ')}")) if nd is not None else "not checked"
        self.zf_where = interp
        self.zf_rev = f"{r.s(b, 'deepspeed_rev', '?')} ({r.note(b, 'deepspeed_rev')})"

    def export(self):
        r, b = self.r, "export_bench"
        for where, label in (("disk", "to disk (WORKDIR)"), ("shm", "to /dev/shm")):
            if not r.has(b, f"{where}.export_s"):
                continue
            nb = r.f(b, f"{where}.export_bytes")
            e, w = r.f(b, f"{where}.export_s"), r.f(b, f"{where}.cat_export_output_to_file_s")
            self.row("export (export_bench)", f"`ckptfs export` (every view) {label}",
                     f"{fmt_gbs(gbs(nb, e))} ({fmt_s(e)}, peak RSS {r.f(b, f'{where}.export_rss_kib') / 1024:.0f} MiB)",
                     f"cat of export's own output to a file {fmt_gbs(gbs(nb, w))}", w / e, None,
                     "the same bytes written without merging")

    def universal(self):
        r, b = self.r, "universal_bench"
        cp, plain = r.f(b, "cp_universal_s"), r.f(b, "cp_plain_s")
        self.row("universal/ (universal_bench)",
                 f"`cp -r` of universal/ ({int(r.f(b, 'files')):,} files, {r.f(b, 'copied_bytes') / 1e6:.0f} MB; mount {fmt_s(r.f(b, 'mount_s'))})",
                 fmt_s(cp), f"`cp -r` of the same tree from a plain directory {fmt_s(plain)}", plain / cp, None,
                 "time ratio")

    def dcp(self):
        r, b = self.r, "dcp_bench"
        db = r.f(b, "distcp_bytes")
        pt = gbs(db, r.f(b, "passthrough_ll.ra1024.first_s"))
        for view in ("model.safetensors", "full_state.pt", FP32):
            vb, s = r.f(b, f"ckptfs.{view}.bytes"), r.f(b, f"ckptfs.{view}.first_s")
            self.row("PyTorch DCP (dcp_bench)", f"first read of `{view}`, sources in the page cache",
                     fmt_gbs(gbs(vb, s)), f"passthrough_ll first read of the .distcp files {fmt_gbs(pt)}",
                     gbs(vb, s) / pt, None, "view bytes / s against .distcp bytes / s")
        conv = r.f(b, "dcp_to_torch_save_s")
        base = f"dcp_to_torch_save {fmt_s(conv)} (the call)"
        if r.has(b, "export.disk.s"):
            self.row("PyTorch DCP (dcp_bench)", "`ckptfs export` (every view, ~2.75x out.pt's bytes) to disk",
                     fmt_s(r.f(b, "export.disk.s")), base, conv / r.f(b, "export.disk.s"), None, "time ratio")
        self.row("PyTorch DCP (dcp_bench)", "mount + `cp full_state.pt` (the same file as out.pt)",
                 fmt_s(r.f(b, "mount_cp_full_state_s")), base, conv / r.f(b, "mount_cp_full_state_s"), None,
                 "time ratio")

    def megatron(self):
        r, b = self.r, "megatron_bench"
        sb = r.f(b, "shard_bytes")
        pt = gbs(sb, r.f(b, "passthrough_ll.ra1024.first_s"))
        for view in ("model.safetensors", FP32, "hf/model.safetensors"):
            vb, s = r.f(b, f"ckptfs.{view}.bytes"), r.f(b, f"ckptfs.{view}.first_s")
            self.row("Megatron-LM TP=4 x PP=2 (megatron_bench)", f"first read of `{view}`, sources in the page cache",
                     fmt_gbs(gbs(vb, s)), f"passthrough_ll first read of the rank files {fmt_gbs(pt)}",
                     gbs(vb, s) / pt, None, "view bytes / s against rank-file bytes / s")

    def gguf(self):
        r, b = self.r, "gguf_bench"
        model_s = r.f(b, "model.first_s")
        for label, target in (("bf16", 0.8), ("q8_0", 0.5)):
            s = r.f(b, f"{label}.first_s")
            self.row("gguf/ for llama.cpp (gguf_bench)", f"first read of the {label} GGUF file, source in the page cache",
                     fmt_s(s), f"first read of model.safetensors of the same mount {fmt_s(model_s)}", model_s / s,
                     target, "time ratio")
        offline = r.f(b, "offline_convert_quantize_s")
        mounted = r.f(b, "q8_0.first_s")
        self.row("gguf/ for llama.cpp (gguf_bench)", "first read of the q8_0 file (nothing written)", fmt_s(mounted),
                 f"convert_hf_to_gguf.py --outtype bf16 + llama-quantize Q8_0 {fmt_s(offline)}", offline / mounted,
                 None, "time ratio")

    def rank_sweep(self):
        r, b = self.r, "rank_sweep"
        dps = sorted({int(k.split(".")[0][2:]) for k in r.keys(b) if k.endswith(".fp32.cold_s")})
        if not dps:
            raise KeyError("rank_sweep: no rank counts")
        pd = self.plot_data.setdefault("ranks", {})
        for dp in dps:
            m = r.f(b, f"dp{dp}.fp32_master_bytes")
            cat = gbs(r.f(b, f"dp{dp}.optim_bytes"), r.f(b, f"dp{dp}.cat_optim_warm_s"))
            disk = gbs(r.f(b, f"dp{dp}.shard_bytes"), r.f(b, f"dp{dp}.cat_all_cold_s"))
            fw, mw, fc = (gbs(m, r.f(b, f"dp{dp}.{k}")) for k in ("fp32.warm_s", "model.warm_s", "fp32.cold_s"))
            pd[dp] = {"cat": cat, "disk": disk, "fp32_warm": fw, "model_warm": mw, "fp32_cold": fc,
                      "mount_s": r.f(b, f"dp{dp}.mount_s"), "files": int(r.f(b, f"dp{dp}.files"))}
            g = "rank sweep: the bench model at several rank counts (run_all.sh --rank-sweep)"
            self.row(g, f"{dp} ranks: `{FP32}` warm first read (best of 3 mounts)", fmt_gbs(fw),
                     f"cat of the shards {fmt_gbs(cat)}", fw / cat, T_WARM_FP32,
                     f"{pd[dp]['files']} files; mount {fmt_s(pd[dp]['mount_s'])}")
            self.row(g, f"{dp} ranks: `{MODEL}` warm first read (best of 3 mounts)", fmt_gbs(mw),
                     f"cat of the shards {fmt_gbs(cat)}", mw / cat, T_WARM_BF16, "")
            self.row(g, f"{dp} ranks: `{FP32}` cold first read", fmt_gbs(fc), f"disk {fmt_gbs(disk)}", fc / disk,
                     T_COLD, "one run each")

    def scale(self):
        r, b = self.r, "scale_bench"
        pd = self.plot_data.setdefault("scale", {})
        for case in SWEEP_CASES + ["many_params_100k_z2_dp2"]:
            page = [float(v) for k in r.keys(b) if k.startswith(f"{case}.page.rep") for v, _ in r.d[(b, k)]]
            cached = [float(v) for k in r.keys(b) if k.startswith(f"{case}.cached.rep") for v, _ in r.d[(b, k)]]
            if page:
                pd[case] = median(page)
            if page and cached and case in ("scale_z3_dp1024", "many_params_100k_z2_dp2"):
                self.row("mount (scale_bench)", f"`{case}`: mount from the index cache",
                         fmt_s(median(cached)), f"cold mount (parses every file) {fmt_s(median(page))}",
                         median(page) / median(cached), None, f"medians of {len(page)}; see scale.md")
        if not pd:
            raise KeyError("scale_bench: no mounts")

    # ---- plots -------------------------------------------------------------------------------------------
    def plots(self, out_dir):
        made = []
        for name, fn in (("ranks", self.plot_ranks), ("readers", self.plot_readers),
                         ("cold-warm", self.plot_cold_warm), ("zero_to_fp32", self.plot_zf)):
            path = os.path.join(out_dir, f"performance-{name}.png")
            try:
                ok = fn(path)
            except Exception as e:  # noqa: BLE001 (a plot that fails is left out; the page is still written)
                print(f"plot {name}: {type(e).__name__}: {e}", file=sys.stderr)
                plt.close("all")
                ok = False
            if ok:
                made.append((name, os.path.basename(path)))
            elif os.path.exists(path):
                os.remove(path)  # no stale plot of an earlier run
        return made

    def finish_bar_axis(self, ax, ylabel, title, bench, has_data, fontsize=None):
        """Labels a bar chart's axis; a legend when it has bars, else why there are none."""
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=fontsize)
        ax.grid(alpha=0.3, axis="y")
        if has_data:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no figures: {bench} {self.status(bench)}", ha="center", transform=ax.transAxes)

    def plot_ranks(self, path):
        rk, sc = self.plot_data.get("ranks"), self.plot_data.get("scale", {})
        if not rk:
            return False
        fig, (a, c) = plt.subplots(1, 2, figsize=(12, 4.6))
        dps = sorted(rk)
        for key, label, style in (("fp32_warm", f"ckptfs {FP32}, first read, sources warm", "o-"),
                                  ("model_warm", f"ckptfs {MODEL} (fp32 -> bf16), first read, warm", "s-"),
                                  ("fp32_cold", f"ckptfs {FP32}, first read, caches dropped", "^-"),
                                  ("cat", "cat of the optimizer shards, page cache", "o--"),
                                  ("disk", "cat of every shard file, caches dropped (disk)", "^--")):
            a.plot(dps, [rk[d][key] for d in dps], style, label=label)
        a.set_xscale("log", base=2)
        a.set_xticks(dps)
        a.set_xticklabels([str(d) for d in dps])
        a.set_xlabel("data-parallel ranks (ZeRO-3 bf16, the same 1.08 GB of fp32 masters)")
        a.set_ylabel("GB/s (ckptfs: fp32 master bytes / s; cat: its own bytes / s)")
        a.set_ylim(bottom=0)
        a.set_title("read throughput vs ranks (run_all.sh --rank-sweep)")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
        c.plot(dps, [rk[d]["mount_s"] for d in dps], "o-", label="bench model (144 tensors), -o index_cache=off")
        sd = [(int(k.rsplit("dp", 1)[1]), v) for k, v in sc.items() if k in SWEEP_CASES]
        if sd:
            sd.sort()
            c.plot([x for x, _ in sd], [y for _, y in sd], "s-", label="scale_z3 (22 tensors), cold mount (scale_bench)")
        c.set_xscale("log", base=2)
        c.set_yscale("log")
        c.set_xlabel("data-parallel ranks")
        c.set_ylabel("seconds until the mount is live")
        c.set_title("mount time vs ranks (sources in the page cache)")
        c.grid(alpha=0.3, which="both")
        c.legend(fontsize=7)
        save(fig, path)
        return True

    def plot_readers(self, path):
        ld, wm = self.plot_data.get("loader", {}), self.plot_data.get("warm", {})
        if not ld and not wm:
            return False
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
        combos = [("safe_open", MODEL), ("safe_open", FP32), ("torch_load", "fp32/pytorch_model.bin")]
        for ax, state in zip(axes[:2], ("cold", "warm")):
            labels, x = [], 0
            for loader, view in combos:
                for t in (1, 4):
                    v = ld.get((state, loader, view, t))
                    if v is None:
                        continue
                    ax.bar(x - 0.2, v[0], 0.4, color="C0", label="mount" if x == 0 else None)
                    ax.bar(x + 0.2, v[1], 0.4, color="C1", label="exported file" if x == 0 else None)
                    labels.append(f"{loader}\n{short_view(view)}\n{t} thr")
                    x += 1
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, fontsize=7)
            self.finish_bar_axis(ax, "GB/s (tensor bytes / s)", f"loaders, 1 vs 4 threads, {state} (loader_bench)",
                                 "loader_bench", bool(labels))
        ax = axes[2]
        if wm:
            names = [("ckptfs\nfp32/model.safetensors", wm[FP32]["first1_view"], wm[FP32]["first4_view"]),
                     ("ckptfs\nmodel.safetensors (bf16)", wm[MODEL]["first1_view"], wm[MODEL]["first4_view"]),
                     ("passthrough_ll\n(shards)", wm["pt1"], wm["pt4"])]
            for i, (n, one, four) in enumerate(names):
                ax.bar(i - 0.2, one, 0.4, color="C2", label="1 reader" if i == 0 else None)
                ax.bar(i + 0.2, four, 0.4, color="C3", label="4 readers" if i == 0 else None)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels([n for n, _, _ in names], fontsize=7)
        self.finish_bar_axis(ax, "GB/s (the file's own bytes / s)",
                             "first read, 1 vs 4 readers, sources warm (mount_bench)", "mount_bench", bool(wm))
        save(fig, path)
        return True

    def plot_cold_warm(self, path):
        cold, warm = self.plot_data.get("cold", {}), self.plot_data.get("warm", {})
        if not cold and not warm:
            return False
        ld = self.plot_data.get("loader", {})
        fig, (ax, lx) = plt.subplots(1, 2, figsize=(14, 4.6), gridspec_kw={"width_ratios": [1, 1.2]})
        bars = []
        for view in (FP32, MODEL):
            short = "fp32 view" if view == FP32 else "bf16 view"
            if view in cold:
                bars.append((f"{short}\ncold", cold[view]["ck"], cold[view]["disk"]))
            if view in warm:
                bars.append((f"{short}\nwarm", warm[view]["first1"], warm["cat"]))
        for i, (label, ck, base) in enumerate(bars):
            ax.bar(i - 0.2, ck, 0.4, color="C0", label="ckptfs first read (fp32 master bytes / s)" if i == 0 else None)
            ax.bar(i + 0.2, base, 0.4, color="C7",
                   label="baseline: cat of the shards (cold: disk, warm: page cache)" if i == 0 else None)
            ax.text(i - 0.2, ck, f"{ck / base:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b[0] for b in bars], fontsize=8)
        self.finish_bar_axis(ax, "GB/s", "first read: cold (cold_read_bench, prefetch 32) vs warm (mount_bench)",
                             "cold_read_bench", bool(bars), fontsize=10)
        combos = sorted({k[1:] for k in ld}, key=lambda c: (c[0], c[1], c[2]))
        for i, c in enumerate(combos):
            for off, state, color in ((-0.2, "cold", "C0"), (0.2, "warm", "C1")):
                v = ld.get((state,) + c)
                if v:
                    lx.bar(i + off, v[0] / v[1], 0.4, color=color, label=state if i == 0 else None)
        lx.axhline(T_LOADER, color="C3", ls="--", lw=1, label=f"target (cold) {T_LOADER}")
        lx.axhline(1.0, color="gray", lw=0.8)
        lx.set_xticks(range(len(combos)))
        lx.set_xticklabels([f"{lo}\n{short_view(v)}\n{t} thr" for lo, v, t in combos],
                           fontsize=7)
        self.finish_bar_axis(lx, "mount GB/s / exported file GB/s",
                             "loaders on the mount against exported files, cold vs warm (loader_bench)",
                             "loader_bench", bool(combos), fontsize=10)
        save(fig, path)
        return True

    def plot_zf(self, path):
        zf = self.plot_data.get("zf")
        if not zf:
            return False
        fig, (a, c) = plt.subplots(1, 2, figsize=(13, 4.6))
        names = list(zf["cold"])
        y = range(len(names))
        for off, state, color in ((-0.2, "cold", "C0"), (0.2, "warm", "C1")):
            a.barh([i + off for i in y], [zf[state][n][0] for n in names], 0.4, color=color, label=state)
            c.barh([i + off for i in y], [zf[state][n][1] / 1024 for n in names], 0.4, color=color, label=state)
            for i, n in enumerate(names):
                a.text(zf[state][n][0], i + off, f" {zf[state][n][0]:.1f} s", va="center", fontsize=7)
                c.text(zf[state][n][1] / 1024, i + off, f" {zf[state][n][1] / 1024:.0f} MiB", va="center", fontsize=7)
        for ax in (a, c):
            ax.set_yticks(list(y))
            ax.set_yticklabels(names, fontsize=8)
            ax.invert_yaxis()
            ax.grid(alpha=0.3, axis="x")
            ax.legend(fontsize=7)
        a.set_xlabel("seconds (cold: caches dropped first; warm: shards in the page cache)")
        a.set_title("fp32 weights of the 64-rank ZeRO-3 checkpoint: time")
        c.set_xlabel("peak RSS, MiB (the process; for mounts, the daemon)")
        c.set_title("peak memory")
        save(fig, path)
        return True

    # ---- the page ----------------------------------------------------------------------------------------
    def write(self, page):
        for bench, fn in (("mount_bench", self.mount_bench), ("cold_read_bench", self.cold_read),
                          ("latency_bench", self.latency), ("loader_bench", self.loader),
                          ("zero_to_fp32_bench", self.zero_to_fp32), ("export_bench", self.export),
                          ("universal_bench", self.universal), ("dcp_bench", self.dcp),
                          ("megatron_bench", self.megatron), ("gguf_bench", self.gguf),
                          ("rank_sweep", self.rank_sweep),
                          ("scale_bench", self.scale)):
            self.section(bench, fn)
        out_dir = os.path.dirname(os.path.abspath(page))
        plots = self.plots(out_dir)
        r = self.r
        fa = lambda k, d="?": r.s("run_all", k, d)  # noqa: E731
        lines = []
        w = lines.append
        w("# Performance: every benchmark, one run")
        w("")
        w("Generated by")
        w("")
        w("```")
        w(f"{fa('command')}    # root; {float(fa('total_s', 'nan')) / 60:.0f} min on {fa('nproc')} CPUs")
        w("```")
        w("")
        w("which runs every bench in `bench/` in sequence (logs in `WORKDIR/run_all/<bench>.log`), each recording")
        w("its raw numbers (`record` in `bench/lib_bench.sh`, into `WORKDIR/run_all/records.tsv`), and then")
        w("`bench/performance_report.py`, which wrote this page and its plots from those records: every figure")
        w("here comes from that one run, each ratio against a baseline measured in the same run, on the same")
        w("machine. Numbers are reported, never asserted. One run: single figures on a shared virtual machine")
        w("move between runs (see the per-bench pages for repeated runs and their spread).")
        w("")
        w("## Machine and run")
        w("")
        mem = float(fa("mem_kib", "0")) / 1048576
        w(f"- {fa('date_start')} to {fa('date_end')}; {float(fa('total_s', 'nan')):.0f} s in all.")
        w(f"- {fa('nproc')} CPUs ({fa('cpu')}), {mem:.1f} GiB memory, kernel {fa('kernel')}, {fa('os')}.")
        w(f"- Load average {fa('loadavg_start')} at the start, {fa('loadavg_end')} at the end (1, 5, 15 min).")
        w(f"- WORKDIR `{fa('workdir')}` on {fa('workdir_fs')}; {float(fa('workdir_free_bytes', '0')) / 1e9:.0f} GB free at the start.")
        w(f"- ckptfs: `{fa('binary')}` ({fa('binary_version')}), built {fa('binary_mtime')}, sha256 "
          f"{fa('binary_sha256')}…, copied once and run from the copy; git HEAD {fa('git_head')} "
          f"(“{r.note('run_all', 'git_head')}”), {fa('git_src_changed')} file(s) of src/ changed or new at the start.")
        w(f"- Torch 2.x chroot (loader, DCP and zero_to_fp32 benches): {fa('chroot')}.")
        if fa("deepspeed_src", ""):
            w(f"- DeepSpeed source for zero_to_fp32.py: `{fa('deepspeed_src')}`"
              + (f", commit {self.zf_rev}" if hasattr(self, "zf_rev") else "") + ".")
        left = fa("mounts_left_at_end", "?")
        w(f"- Mounts left behind under WORKDIR or the chroot's /tmp at the end: {left}"
          + ("" if left == "0" else f" ({r.note('run_all', 'mounts_left_at_end')})") + ".")
        w("")
        w("| bench | result | seconds | load average before → after | log | benchmark / test processes of other sessions at its start; end |")
        w("|---|---|---|---|---|---|")
        for bench in BENCHES:
            st = self.status(bench)
            secs = fa(f"bench.{bench}.s", "")
            lb, la = fa(f"bench.{bench}.loadavg_before", ""), fa(f"bench.{bench}.loadavg_after", "")
            extra = ""
            lm = fa(f"bench.{bench}.left_mounts", "")
            if lm:
                extra = f" (left {lm} mount(s), unmounted by run_all)"
            w(f"| {bench} | {st}{extra} | {float(secs):.0f} |" if secs else f"| {bench} | {st}{extra} | — |")
            ob, oa = fa(f"bench.{bench}.others_before", ""), fa(f"bench.{bench}.others_after", "")
            lines[-1] += f" {lb.split()[0] if lb else '—'} → {la.split()[0] if la else '—'} | " \
                         f"{'`' + bench + '.log`' if secs else '—'} | " \
                         f"{(ob or 'none') + '; ' + (oa or 'none') if secs else ''} |"
        busy = [b for b in BENCHES if fa(f"bench.{b}.others_before", "") or fa(f"bench.{b}.others_after", "")]
        w("")
        if busy:
            w(f"**Not quiet**: benchmark or test processes of other sessions were running at the start or end of "
              f"{', '.join(busy)} (last column): they share the CPUs and the page cache (their drop_caches empty "
              "it under a warm measurement), so those benches' figures may be off; rerun before quoting one.")
        else:
            w("No benchmark or test process of another session was seen at any bench's start or end.")
        failed = [b for b in BENCHES if self.status(b).startswith(("failed", "timed out"))]
        for b in failed:
            w("")
            w(f"**{b} {self.status(b)}**; the end of its log:")
            w("")
            w("```")
            lines.extend(self.log_tail(b))
            w("```")
        w("")
        w("## Targets")
        w("")
        w("The issue's targets (reported, never asserted) and the rows of the table below that measure them:")
        w("")
        names = {T_COLD: "cold first read of a merged view >= 0.8x the disk's sequential rate for the bytes it needs",
                 T_LATENCY: "with 1 ms added per source I/O, >= 0.5x a plain cat of those bytes from the same storage",
                 T_LOADER: "mmap loaders through the mount >= 0.7x the same loader on exported files, cold",
                 T_WARM_FP32: "warm first read of the fp32 view >= 0.4x cat of the same source bytes",
                 T_WARM_BF16: "warm first read with fp32 -> bf16 (model.safetensors) >= 0.3x cat of the same source bytes"}
        by_target = collections.defaultdict(list)
        for g, what, ck, base, ratio, target, note in self.rows:
            if target is not None and ratio is not None:
                by_target[target].append((g, what, ratio))
        for target, name in names.items():
            rows = by_target.get(target, [])
            if not rows:
                w(f"- **{name}**: not measured in this run.")
                continue
            main = [x for x in rows if not x[0].startswith("rank sweep")]
            sweep = [x for x in rows if x[0].startswith("rank sweep")]
            parts = []
            for g, what, ratio in main:
                parts.append(f"{what.replace('`', '')}: {ratio:.2f} ({'met' if ratio >= target else 'not met'})")
            if sweep:
                sm = [x for x in sweep if x[2] >= target]
                parts.append(f"rank sweep: met at {len(sm)} of {len(sweep)} rank counts "
                             f"({', '.join(f'{x[2]:.2f}' for x in sweep)})")
            if main:
                verdict = "**met**" if all(x[2] >= target for x in main) else (
                    "**not met**" if not any(x[2] >= target for x in main) else "**partly met**")
            else:
                verdict = "not measured by its own bench in this run"
            w(f"- {name}: {verdict}. {'; '.join(parts)}.")
        w("")
        w("## Ratios")
        w("")
        w("ratio = ckptfs's rate / the baseline's rate (for times: the baseline's seconds / ckptfs's), so **> 1:")
        w("ckptfs is faster**. On the 64-rank bench checkpoint (`bench_z3_dp64`: 128 shard files, "
          f"{float(fa('bench_z3_dp64.shard_bytes', 'nan')) / 1e9:.2f} GB), "
          "the rates of the merged views in the targets' rows count **the source bytes the view is made from**: "
          f"the fp32 master weights, {self.masters_or_nan() / 1e9:.3f} GB (the fp32 view is "
          "larger, as it repeats the tied head.weight; the bf16 view is about half of it), against the baseline's rate for")
        w("the bytes it reads (cat of the shard files), i.e. the time a cat would take to deliver the bytes the view needs")
        w("over the view's time. The notes give the same ratio counted on the view's own bytes.")
        w("Target column: the issue's target for that row (met: ratio >= target).")
        w("")
        w("| bench | what | ckptfs | baseline (same run) | ratio | target | notes |")
        w("|---|---|---|---|---|---|---|")
        for g, what, ck, base, ratio, target, note in self.rows:
            rs = f"**{ratio:.2f}**" if ratio is not None else "—"
            ts = "" if target is None or ratio is None else f"{target}: {'met' if ratio >= target else '**not met**'}"
            w(f"| {g} | {what} | {ck} | {base} | {rs} | {ts} | {note} |")
        if hasattr(self, "zf_check"):
            w("")
            w(f"zero_to_fp32.py ran in the {self.zf_where}, through the import shim `bench/zero_to_fp32_bench.sh` "
              f"writes at bench time; untimed check: {self.zf_check}.")
        w("")
        w("## Plots")
        w("")
        captions = {
            "ranks": "Throughput vs ranks: the same model (1.08 GB of fp32 masters) saved at each rank count by the "
                     "generator's generate_bench; first reads with the sources warm and cold, against cat (left); "
                     "seconds until the mount is live, for that model and for scale_bench's tiny model (right).",
            "readers": "Throughput vs reader count: the loaders on the mount and on exported files, 1 and 4 "
                       "threads, cold and warm (loader_bench); cat / dd readers of the views and passthrough_ll "
                       "(mount_bench).",
            "cold-warm": "Cold vs warm: first read of each view with caches dropped (against the disk's rate for "
                         "the shards) and with the sources in the page cache (against cat); ratio above each bar.",
            "zero_to_fp32": "vs zero_to_fp32: DeepSpeed's converter against ckptfs export, mount + cp, and mount + "
                            "first read, cold and warm; time and peak memory.",
        }
        if not plots:
            w("No plot: the benches they draw on recorded nothing in this run.")
        for name, fname in plots:
            w(f"![{name}]({fname})")
            w("")
            w(captions[name])
            w("")
        for heading in KEPT_SECTIONS:
            lines.extend(kept_section(page, heading))
        w("## Per-bench pages")
        w("")
        w("Each bench's header states its command, what it compares and how long it takes. Pages with more detail:")
        w("")
        for doc, what in (("scale.md", "mount and metadata walks by ranks and tensors (rewritten by this run)"),
                          ("loader-bench.md", "loaders on the mount against exported files (an earlier run, by hand)"),
                          ("latency-bench.md", "cold reads with 1 ms per source read (rewritten by this run)"),
                          ("megatron-bench.md", "Megatron-LM first reads (earlier runs, by hand)"),
                          ("s3-bench.md", "a checkpoint on object storage (bench/s3_bench.sh, not part of run_all)")):
            if os.path.exists(os.path.join(out_dir, doc)):
                w(f"- [{doc}]({doc}): {what}")
        w("")
        with open(page + ".tmp", "w") as f:
            f.write("\n".join(lines))
        os.replace(page + ".tmp", page)
        return plots

    def masters_or_nan(self):
        try:
            return self.masters()
        except KeyError:
            return float("nan")


# A section of the page written by hand (its bench is not part of run_all): kept as it is when the page is
# rewritten, from its heading to the next one.
# Sections written by hand from benches whose records this page does not draw on: kept as they are.
KEPT_SECTIONS = ("## Object storage", "## FSDP per-rank saves")


def kept_section(page, heading):
    try:
        with open(page) as f:
            old = f.read().split("\n")
    except FileNotFoundError:
        return []
    if heading not in old:
        return []
    start = old.index(heading)
    end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
    return old[start:end]


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rep = Report(argv[1])
    plots = rep.write(argv[2])
    print(f"wrote {argv[2]} ({len(rep.rows)} rows) and {len(plots)} plot(s): {', '.join(p for _, p in plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
