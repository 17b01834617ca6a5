#!/usr/bin/env python3
"""Table and plot of bench/scale_bench.sh: reads the raw numbers it wrote (OUT/facts.tsv, runs.tsv,
inspect.tsv, cases.tsv, verify.tsv), writes the markdown page (medians, machine facts, growth, targets) and the PNG.

    python3 bench/scale_plot.py OUT docs/scale.md docs/scale.png

Needs python3-matplotlib (Agg backend, no display)."""
import csv
import math
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

RANK_CASES = ["scale_z3_dp8", "scale_z3_dp64", "scale_z3_dp512", "scale_z3_dp1024"]
TENSOR_CASES = ["many_params_z2_dp2", "many_params_100k_z2_dp2"]
# runs.tsv variants: cold (fresh, empty index cache) with the source in the page cache, then with dropped
# caches; index_cache=off; from the index cache a cold mount filled, page cache and dropped caches.
VARIANTS = ("page", "dropped", "off", "cached", "cached_dropped")
LOADED = "ckptfs: index loaded from "


def read_tsv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def median(xs):
    return statistics.median(xs) if xs else None


def exponent(n0, t0, n1, t1):
    """log-log slope between two points: t ~ n**e."""
    return math.log(t1 / t0) / math.log(n1 / n0)


def kind(e):
    if e < 0.85:
        return "sub-linear"
    if e <= 1.15:
        return "about linear"
    return "super-linear"


def linfit(xs, ys):
    """least squares t = a + b*n; returns a, b, R^2."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    r2 = 1 - sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / ss if ss else 1.0
    return a, b, r2


def fmt_bytes(v):
    if v is None:
        return "-"
    return f"{v / 1024:.0f} KiB" if v < 1024 * 1024 else f"{v / 1048576:.1f} MiB"


def fmt_s(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def main(out, md_path, png_path):
    facts = {r[0]: r[1] for r in csv.reader(open(os.path.join(out, "facts.tsv")), delimiter="\t")}
    runs = read_tsv(os.path.join(out, "runs.tsv"))
    insp = read_tsv(os.path.join(out, "inspect.tsv"))
    cases = {r["case"]: r for r in read_tsv(os.path.join(out, "cases.tsv"))}
    verified = read_tsv(os.path.join(out, "verify.tsv"))
    dropped = facts.get("dropped") == "yes"
    not_loaded = [r["case"] for r in verified if not r["stderr"].startswith(LOADED)]
    if not_loaded or {r["case"] for r in verified} != set(cases):
        sys.exit(f"the -f mounts from the index cache did not all load the index: {verified}")

    med = {}  # (case, variant, key) -> median
    for name in cases:
        for variant in VARIANTS:
            rows = [r for r in runs if r["case"] == name and r["variant"] == variant]
            for key in ("mount_s", "ls_s", "du_s", "rss_mount_kib", "hwm_kib", "daemon_cpu_ls_s", "index_bytes"):
                med[name, variant, key] = median([float(r[key]) for r in rows if r[key] != ""])
        for key, column in (("inspect", "inspect_s"), ("index", "index_s")):
            med[name, key] = median([float(r[column]) for r in insp if r["case"] == name])
    order = [c for c in RANK_CASES + TENSOR_CASES if c in cases]
    n = {c: int(cases[c]["ranks"]) for c in order}
    nt = {c: int(cases[c]["tensors"]) for c in order}
    ent = {c: int(cases[c]["entries"]) for c in order}

    def m(c, key, variant="page"):
        return med[c, variant, key]

    # ---- tables -------------------------------------------------------------------------------------
    mib = lambda kib: f"{kib / 1024:.0f}" if kib is not None else "-"  # noqa: E731
    # (heading, variant) of the mount columns
    mounts = [("cold mount, page cache (s)", "page"), ("cold mount, dropped caches (s)", "dropped"),
              ("mount, index_cache=off (s)", "off"), ("mount from index cache, page cache (s)", "cached"),
              ("mount from index cache, dropped caches (s)", "cached_dropped")]
    mounts = [(h, v) for h, v in mounts if dropped or "dropped" not in v]
    head = ["case", "ranks", "tensors", "source files", "tree entries"] + [h for h, _ in mounts]
    head += ["index file", "ckptfs index (s)", "inspect (s)", "ls -lR (s)", "du -s (s)",
             "daemon CPU in ls -lR (s)", "RSS after mount / peak (MiB)", "RSS after mount from index (MiB)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in order:
        row = [f"`{c}`", f"{n[c]:,}", f"{nt[c]:,}", f"{int(cases[c]['source_files']):,}", f"{ent[c]:,}"]
        row += [fmt_s(m(c, "mount_s", v)) for _, v in mounts]
        row += [fmt_bytes(m(c, "index_bytes")), fmt_s(med[c, "index"]), fmt_s(med[c, "inspect"]),
                fmt_s(m(c, "ls_s")), fmt_s(m(c, "du_s")), f"{m(c, 'daemon_cpu_ls_s'):.2f}",
                f"{mib(m(c, 'rss_mount_kib'))} / {mib(m(c, 'hwm_kib'))}", mib(m(c, "rss_mount_kib", "cached"))]
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    # ---- growth -------------------------------------------------------------------------------------
    growth = []

    def from_index(group, what, x, unit, units):
        """The index cache bullet of a sweep: cases `group` by `what` (counts `x`); the index size per `unit`
        (counts `units`)."""
        a, b = group[0], group[-1]
        cold, hot = m(b, "mount_s"), m(b, "mount_s", "cached")
        dropped_text = (f"; after dropping caches {fmt_s(m(b, 'mount_s', 'cached_dropped'))} s (cold: "
                        f"{fmt_s(m(b, 'mount_s', 'dropped'))} s)" if dropped else "")
        return (
            f"- **From the index cache** ({what}): the mount takes {fmt_s(m(a, 'mount_s', 'cached'))} s at "
            f"{x[a]:,} {what} to {fmt_s(hot)} s at {x[b]:,} (log-log slope "
            f"{exponent(x[a], m(a, 'mount_s', 'cached'), x[b], hot):.2f}), against {fmt_s(cold)} s cold: "
            f"{cold / hot:.1f}x faster at {x[b]:,}{dropped_text}. What is left is reading and decoding the index, "
            f"checking the {int(cases[b]['source_files']):,} source files' identity, building the tree of "
            f"{ent[b]:,} entries and starting FUSE. The index file: {fmt_bytes(m(a, 'index_bytes'))} -> "
            f"{fmt_bytes(m(b, 'index_bytes'))} ({m(b, 'index_bytes') / units[b]:.0f} bytes per {unit}). The daemon "
            f"writes it once the mount is live, so a cold mount costs what `index_cache=off` costs: cold minus off "
            f"is {cold - m(b, 'mount_s', 'off'):+.3f} s at {x[b]:,} {what} (a difference of medians, so noisy); "
            f"`ckptfs index SRC --cache DIR` (parse and "
            f"write, no tree, no FUSE) takes {fmt_s(med[b, 'index'])} s there (inspect: "
            f"{fmt_s(med[b, 'inspect'])} s). The daemon's RSS right after mounting: "
            f"{mib(m(b, 'rss_mount_kib', 'cached'))} MiB from the index, {mib(m(b, 'rss_mount_kib'))} MiB cold.")
    rc = [c for c in RANK_CASES if c in cases]
    if len(rc) >= 2:
        steps = ", ".join(f"{n[a]:,}->{n[b]:,}: {exponent(n[a], m(a, 'mount_s'), n[b], m(b, 'mount_s')):.2f}"
                          for a, b in zip(rc, rc[1:]))
        a, b, r2 = linfit([n[c] for c in rc], [m(c, "mount_s") for c in rc])
        e_max = max(exponent(n[a], m(a, "mount_s"), n[b], m(b, "mount_s")) for a, b in zip(rc, rc[1:]))
        overall = exponent(n[rc[0]], m(rc[0], "mount_s"), n[rc[-1]], m(rc[-1], "mount_s"))
        worst = ("no step grows faster than linearly (slopes below 1: a fixed start-up cost, and noise)"
                 if e_max <= 1.15 else f"the steepest step is {kind(e_max)}")
        growth.append(
            f"- **Ranks** (ZeRO-3, {nt[rc[0]]} tensors, 2 files per rank): cold mount {fmt_s(m(rc[0], 'mount_s'))} s at "
            f"{n[rc[0]]:,} ranks to {fmt_s(m(rc[-1], 'mount_s'))} s at {n[rc[-1]]:,}. Log-log slope per step "
            f"(1 = linear) {steps}, {overall:.2f} overall: {worst}. A straight line fits "
            f"t = {a * 1e3:.1f} ms + {b * 1e3:.3f} ms x ranks (R^2 = {r2:.3f}), i.e. "
            f"{b * 1e3 / 2:.3f} ms per rank file. inspect (no tree, no FUSE) is "
            f"{fmt_s(med[rc[-1], 'inspect'])} s at {n[rc[-1]]:,} ranks "
            f"({med[rc[-1], 'inspect'] / m(rc[-1], 'mount_s'):.0%} of the mount): reading and indexing the rank "
            f"files is the mount's cost. The tree grows by "
            f"2 entries per rank (universal/ passes each rank's model-states file through, at the root and under "
            f"tags/<tag>/), so ls -lR and du stay at {fmt_s(m(rc[-1], 'ls_s'))} s and {fmt_s(m(rc[-1], 'du_s'))} s.")
        if dropped:
            growth.append(
                f"- With dropped caches the {n[rc[-1]]:,}-rank cold mount takes {fmt_s(m(rc[-1], 'mount_s', 'dropped'))} s "
                f"(page cache: {fmt_s(m(rc[-1], 'mount_s'))} s): reading the {int(cases[rc[-1]]['source_files']):,} "
                f"files ({int(cases[rc[-1]]['source_bytes']) / 1e6:.1f} MB) and the binary from disk.")
        growth.append(from_index(rc, "ranks", n, "source file", {c: int(cases[c]["source_files"]) for c in rc}))
    tc = [c for c in TENSOR_CASES if c in cases]
    if len(tc) >= 2:
        a, b = tc[0], tc[-1]

        def e(key, variant="page"):
            return exponent(nt[a], m(a, key, variant), nt[b], m(b, key, variant))

        ei = exponent(nt[a], med[a, "inspect"], nt[b], med[b, "inspect"])
        growth.append(
            f"- **Tensors** (ZeRO-2, DP 2; {nt[a]:,} -> {nt[b]:,} tensors, x{nt[b] / nt[a]:.2f}; tree entries "
            f"{ent[a]:,} -> {ent[b]:,}): cold mount {fmt_s(m(a, 'mount_s'))} -> {fmt_s(m(b, 'mount_s'))} s "
            f"(slope {e('mount_s'):.2f}, {kind(e('mount_s'))}), inspect {fmt_s(med[a, 'inspect'])} -> "
            f"{fmt_s(med[b, 'inspect'])} s (slope {ei:.2f}), ls -lR {fmt_s(m(a, 'ls_s'))} -> {fmt_s(m(b, 'ls_s'))} s "
            f"(slope {e('ls_s'):.2f}; {m(a, 'ls_s') / ent[a] * 1e6:.0f} -> {m(b, 'ls_s') / ent[b] * 1e6:.0f} us per "
            f"entry), du -s {fmt_s(m(a, 'du_s'))} -> {fmt_s(m(b, 'du_s'))} s (slope {e('du_s'):.2f}), peak RSS "
            f"{mib(m(a, 'hwm_kib'))} -> {mib(m(b, 'hwm_kib'))} MiB (slope {e('hwm_kib'):.2f}; "
            f"{m(b, 'hwm_kib') * 1024 / nt[b] / 1024:.1f} KiB per tensor, "
            f"{m(b, 'hwm_kib') * 1024 / ent[b]:.0f} bytes per tree entry). Two points only: the slope is the "
            f"exponent between them.")
        ta, tb = m(a, "mount_s", "off") - med[a, "inspect"], m(b, "mount_s", "off") - med[b, "inspect"]
        if ta > 0 and tb > 0:
            growth.append(
                f"- **Tree build** (the `index_cache=off` mount minus inspect, a difference of medians, so noisy): {ta:.2f} -> {tb:.2f} s "
                f"for {ent[a]:,} -> {ent[b]:,} entries (slope {exponent(ent[a], ta, ent[b], tb):.2f}, "
                f"{kind(exponent(ent[a], ta, ent[b], tb))}; {ta / ent[a] * 1e6:.1f} -> {tb / ent[b] * 1e6:.1f} us "
                f"per entry).")
        frac = med[b, "inspect"] / m(b, "mount_s")
        growth.append(
            f"- **What dominates the {nt[b]:,}-tensor cold mount**: `ckptfs inspect` (index, validation and the "
            f"merged views, but no tree and no FUSE) takes {fmt_s(med[b, 'inspect'])} s of the "
            f"{fmt_s(m(b, 'mount_s'))} s ({frac:.0%}); building the tree of {ent[b]:,} entries "
            f"({int(cases[b]['universal_files']):,} "
            f"universal/ files for {int(cases[b]['trainable']):,} trainable parameters, listed at the root and "
            f"under tags/<tag>/) and starting FUSE take the rest (the daemon writes the index after the mount is live). "
            f"ls -lR costs the daemon {m(b, 'daemon_cpu_ls_s'):.1f} CPU s of its {fmt_s(m(b, 'ls_s'))} s wall "
            f"time; the rest is the kernel and ls (a FUSE lookup and getattr round trip per entry).")
        growth.append(from_index(tc, "tensors", nt, "tensor", nt))

    # ---- targets ------------------------------------------------------------------------------------
    def verdict(v, limit):
        return "met" if v <= limit else f"**not met**: {v / limit:.2f}x"

    tg = ["| target | measured (median) | |", "|---|---|---|"]
    big_r = "scale_z3_dp1024" if "scale_z3_dp1024" in cases else None
    big_t = "many_params_100k_z2_dp2" if "many_params_100k_z2_dp2" in cases else None
    cold = [("page", "page cache"), ("dropped", "dropped caches"), ("off", "index_cache=off")]
    cached = [("cached", "page cache"), ("cached_dropped", "dropped caches")]

    def target_row(case, label, limit, variants):
        """variants: (variant, label) of the mounts measured against the target."""
        variants = [(v, lv) for v, lv in variants if dropped or "dropped" not in v]
        got = ", ".join(f"{fmt_s(m(case, 'mount_s', v))} s ({lv})" for v, lv in variants)
        verdicts = ", ".join(f"{verdict(m(case, 'mount_s', v), limit)} ({lv})" for v, lv in variants)
        return f"| {label} <= {limit:g} s | {got} | {verdicts} |"

    if big_r:
        tg.append(target_row(big_r, "1,024 ranks, cold mount", 1.0, cold))
        tg.append(target_row(big_r, "1,024 ranks, from the index cache", 0.1, cached))
    if big_t:
        tg.append(target_row(big_t, "100,000 tensors, cold mount", 5.0, cold))

    # ---- plot ---------------------------------------------------------------------------------------
    series = [("mount_s", "page", "cold mount (source in page cache)", "C0", "o-")]
    if dropped:
        series.append(("mount_s", "dropped", "cold mount (dropped caches)", "C0", "o--"))
    series.append(("mount_s", "cached", "mount from index cache (page cache)", "C4", "D-"))
    if dropped:
        series.append(("mount_s", "cached_dropped", "mount from index cache (dropped caches)", "C4", "D--"))
    series += [("inspect", None, "ckptfs inspect (no tree)", "C1", "s:"),
               ("ls_s", "page", "ls -lR", "C2", "^-"), ("du_s", "page", "du -s", "C3", "v-")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, group, xs, xlabel, targets in (
            (axes[0], rc, [n[c] for c in rc], "ranks (ZeRO-3, 22 tensors)",
             [(1.0, "grey", "target 1,024 ranks, cold: 1 s"), (0.1, "C4", "target 1,024 ranks, index cache: 0.1 s")]),
            (axes[1], tc, [nt[c] for c in tc], "tensors (ZeRO-2, DP 2)",
             [(5.0, "grey", "target 100,000 tensors, cold: 5 s")])):
        for key, variant, label, color, style in series:
            ys = [med[c, "inspect"] if key == "inspect" else m(c, key, variant) for c in group]
            ax.plot(xs, [max(y, 1e-4) for y in ys], style, color=color, label=label)
        for target, color, tlabel in targets:
            ax.axhline(target, color=color, linestyle="-.", linewidth=1, label=tlabel)
        ax.set_xscale("log", base=2 if ax is axes[0] else 10)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:,}" for x in xs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel("seconds (median of %s)" % facts.get("reps", "3"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("ckptfs: time by ranks")
    axes[1].set_title("ckptfs: time by tensors")
    fig.suptitle(f"bench/scale_bench.sh, {facts['date']}, {facts['nproc']} CPUs, load average {facts['loadavg']} "
                 f"at the start; cold = fresh, empty index cache", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)

    # ---- page ---------------------------------------------------------------------------------------
    mem_gib = int(facts["mem_kib"]) / 1048576
    drop_text = ("**dropped caches**: `sync; echo 3 > /proc/sys/vm/drop_caches` right before each mount, so the "
                 "source files, the index, the binary and its libraries come from disk." if dropped else
                 "dropped caches: not measured (/proc/sys/vm/drop_caches not writable).")
    load = (f"load average {facts['loadavg']} at the start and {facts['loadavg_end']} at the end; niced "
            f"(background) processes took {float(facts['nice_cpu_share']):.0%} of the CPU time during the run")
    md = f"""# Scale: mount, `ls -lR` and `du` by ranks and by tensors

Generated by `bash bench/scale_bench.sh [WORKDIR]` (one command, one run; it rewrites this page and
[scale.png](scale.png)) on {facts['date']}: {facts['nproc']} CPUs ({facts['cpu']}), {mem_gib:.1f} GiB memory,
kernel {facts['kernel']}, WORKDIR on {facts['fs']}, {facts['ckptfs']}; {load}.
Every number is the median of {facts['reps']} runs. The bench took {float(facts['bench_s']):.0f} s (fixtures:
{float(facts['gen_s']):.0f} s, generated by `mount_tests/gen/generate.py`, reused while current).

- **cold mount**: `ckptfs SRC MNT -o index_cache=DIR` until it returns with the mount live (parse and
  validate every rank file, build the whole tree; the daemon writes the index after that, while it serves,
  and the bench waits for it before the walks), each time by a fresh process with DIR a fresh, empty index
  cache: what the first mount of a checkpoint does. **index_cache=off**: the same mount
  with `-o index_cache=off` (parses, writes no index). **from index cache**: the mount again with the DIR a
  cold mount filled: it loads the index instead of parsing. Every mount from the index cache was checked to
  have loaded it (the index file keeps its inode, mtime and size; a mount that parses rewrites it), and one
  `-f` mount per case ({len(verified)} in all) printed `{LOADED}...` on stderr. **page cache**: the source
  files, the index and the binary are in the page cache (read once before); {drop_text}
- **index file**: the size of the index a cold mount wrote (lz4); **ckptfs index**: `ckptfs index SRC --cache
  DIR` into an empty DIR (parse and write the index, no tree, no FUSE).
- **ls -lR** (`ls -lR MNT > /dev/null`, the first walk of a cold mount) then **du -s** (`du -s MNT`, a second
  walk of the same mount), in the page-cache runs only (the tree is in the daemon's memory: the walks read
  no source file; an earlier run that repeated them after dropping caches measured the same within the
  noise); **tree entries**: `find MNT -mindepth 1 | wc -l` (the root's views and again under `tags/<tag>/`;
  universal/ holds 4 files per trainable parameter plus each rank's model-states file); **daemon CPU in
  ls -lR**: utime + stime of the ckptfs daemon during the ls -lR; **RSS**: the daemon's VmRSS right after a
  cold mount and its VmHWM after both walks, and its VmRSS right after a mount from the index cache.
- **inspect**: `ckptfs inspect SRC` (index, validation and the merged views, but no tree, no FUSE and no
  index cache), for comparison with the mount.
- Cases (`mount_tests/gen/generate.py --only ...`): `scale_z3_dp<N>`: ZeRO-3 bf16 of a tiny 22-tensor model
  (2 files per rank); `many_params_z2_dp2` / `many_params_100k_z2_dp2`: ZeRO-2 bf16, DP 2, 20,480 / 100,000
  small trainable parameters.

<!-- table -->
{table}
<!-- end table -->

![time by ranks and by tensors](scale.png)

## Growth

{chr(10).join(growth)}

## Targets

{chr(10).join(tg)}
"""
    with open(md_path, "w") as f:
        f.write(md)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
