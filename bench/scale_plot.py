#!/usr/bin/env python3
"""Table and plot of bench/scale_bench.sh: reads the raw numbers it wrote (OUT/facts.tsv, runs.tsv,
inspect.tsv, cases.tsv), writes the markdown page (medians, machine facts, growth, targets) and the PNG.

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
NO_CACHE = "index cache: not implemented yet"


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


def fmt_s(v):
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def main(out, md_path, png_path):
    facts = {r[0]: r[1] for r in csv.reader(open(os.path.join(out, "facts.tsv")), delimiter="\t")}
    runs = read_tsv(os.path.join(out, "runs.tsv"))
    insp = read_tsv(os.path.join(out, "inspect.tsv"))
    cases = {r["case"]: r for r in read_tsv(os.path.join(out, "cases.tsv"))}
    dropped = facts.get("dropped") == "yes"

    med = {}  # (case, variant, key) -> median
    for name in cases:
        for variant in ("page", "dropped"):
            rows = [r for r in runs if r["case"] == name and r["variant"] == variant]
            for key in ("mount_s", "ls_s", "du_s", "rss_mount_kib", "hwm_kib", "daemon_cpu_ls_s"):
                med[name, variant, key] = median([float(r[key]) for r in rows if r[key] != ""])
        med[name, "inspect"] = median([float(r["inspect_s"]) for r in insp if r["case"] == name])
    order = [c for c in RANK_CASES + TENSOR_CASES if c in cases]
    n = {c: int(cases[c]["ranks"]) for c in order}
    nt = {c: int(cases[c]["tensors"]) for c in order}
    ent = {c: int(cases[c]["entries"]) for c in order}

    def m(c, key, variant="page"):
        return med[c, variant, key]

    # ---- tables -------------------------------------------------------------------------------------
    mib = lambda kib: f"{kib / 1024:.0f}" if kib is not None else "-"  # noqa: E731
    head = ["case", "ranks", "tensors", "source files", "tree entries", "mount, page cache (s)"]
    if dropped:
        head.append("mount, dropped caches (s)")
    head += ["mount from index cache (s)", "inspect (s)", "ls -lR (s)", "du -s (s)",
             "daemon CPU in ls -lR (s)", "RSS after mount / peak (MiB)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in order:
        row = [f"`{c}`", f"{n[c]:,}", f"{nt[c]:,}", f"{int(cases[c]['source_files']):,}", f"{ent[c]:,}",
               fmt_s(m(c, "mount_s"))]
        if dropped:
            row.append(fmt_s(m(c, "mount_s", "dropped")))
        row += [NO_CACHE, fmt_s(med[c, "inspect"]), fmt_s(m(c, "ls_s")), fmt_s(m(c, "du_s")),
                f"{m(c, 'daemon_cpu_ls_s'):.2f}", f"{mib(m(c, 'rss_mount_kib'))} / {mib(m(c, 'hwm_kib'))}"]
        lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    # ---- growth -------------------------------------------------------------------------------------
    growth = []
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
            f"- **Ranks** (ZeRO-3, {nt[rc[0]]} tensors, 2 files per rank): mount {fmt_s(m(rc[0], 'mount_s'))} s at "
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
                f"- With dropped caches the {n[rc[-1]]:,}-rank mount takes {fmt_s(m(rc[-1], 'mount_s', 'dropped'))} s "
                f"(page cache: {fmt_s(m(rc[-1], 'mount_s'))} s): reading the {int(cases[rc[-1]]['source_files']):,} "
                f"files ({int(cases[rc[-1]]['source_bytes']) / 1e6:.1f} MB) and the binary from disk.")
    tc = [c for c in TENSOR_CASES if c in cases]
    if len(tc) >= 2:
        a, b = tc[0], tc[-1]

        def e(key, variant="page"):
            return exponent(nt[a], m(a, key, variant), nt[b], m(b, key, variant))

        ei = exponent(nt[a], med[a, "inspect"], nt[b], med[b, "inspect"])
        growth.append(
            f"- **Tensors** (ZeRO-2, DP 2; {nt[a]:,} -> {nt[b]:,} tensors, x{nt[b] / nt[a]:.2f}; tree entries "
            f"{ent[a]:,} -> {ent[b]:,}): mount {fmt_s(m(a, 'mount_s'))} -> {fmt_s(m(b, 'mount_s'))} s "
            f"(slope {e('mount_s'):.2f}, {kind(e('mount_s'))}), inspect {fmt_s(med[a, 'inspect'])} -> "
            f"{fmt_s(med[b, 'inspect'])} s (slope {ei:.2f}), ls -lR {fmt_s(m(a, 'ls_s'))} -> {fmt_s(m(b, 'ls_s'))} s "
            f"(slope {e('ls_s'):.2f}; {m(a, 'ls_s') / ent[a] * 1e6:.0f} -> {m(b, 'ls_s') / ent[b] * 1e6:.0f} us per "
            f"entry), du -s {fmt_s(m(a, 'du_s'))} -> {fmt_s(m(b, 'du_s'))} s (slope {e('du_s'):.2f}), peak RSS "
            f"{mib(m(a, 'hwm_kib'))} -> {mib(m(b, 'hwm_kib'))} MiB (slope {e('hwm_kib'):.2f}; "
            f"{m(b, 'hwm_kib') * 1024 / nt[b] / 1024:.1f} KiB per tensor, "
            f"{m(b, 'hwm_kib') * 1024 / ent[b]:.0f} bytes per tree entry). Two points only: the slope is the "
            f"exponent between them.")
        ta, tb = m(a, "mount_s") - med[a, "inspect"], m(b, "mount_s") - med[b, "inspect"]
        if ta > 0 and tb > 0:
            growth.append(
                f"- **Tree build** (mount minus inspect, a difference of medians, so noisy): {ta:.2f} -> {tb:.2f} s "
                f"for {ent[a]:,} -> {ent[b]:,} entries (slope {exponent(ent[a], ta, ent[b], tb):.2f}, "
                f"{kind(exponent(ent[a], ta, ent[b], tb))}; {ta / ent[a] * 1e6:.1f} -> {tb / ent[b] * 1e6:.1f} us "
                f"per entry).")
        frac = med[b, "inspect"] / m(b, "mount_s")
        growth.append(
            f"- **What dominates the {nt[b]:,}-tensor mount**: `ckptfs inspect` (index, validation and the "
            f"merged views, but no tree and no FUSE) takes {fmt_s(med[b, 'inspect'])} s of the "
            f"{fmt_s(m(b, 'mount_s'))} s ({frac:.0%}); building the tree of {ent[b]:,} entries "
            f"({int(cases[b]['universal_files']):,} "
            f"universal/ files for {int(cases[b]['trainable']):,} trainable parameters, listed at the root and "
            f"under tags/<tag>/) and starting FUSE take the rest. "
            f"ls -lR costs the daemon {m(b, 'daemon_cpu_ls_s'):.1f} CPU s of its {fmt_s(m(b, 'ls_s'))} s wall "
            f"time; the rest is the kernel and ls (a FUSE lookup and getattr round trip per entry).")

    # ---- targets ------------------------------------------------------------------------------------
    def verdict(v, limit):
        return "met" if v <= limit else f"**not met**: {v / limit:.1f}x"

    tg = ["| target | measured (median) | |", "|---|---|---|"]
    big_r = "scale_z3_dp1024" if "scale_z3_dp1024" in cases else None
    big_t = "many_params_100k_z2_dp2" if "many_params_100k_z2_dp2" in cases else None
    def target_row(case, label, limit):
        v = m(case, "mount_s")
        return (f"| {label} <= {limit:g} s | {fmt_s(v)} s (page cache)"
                + (f", {fmt_s(m(case, 'mount_s', 'dropped'))} s (dropped caches)" if dropped else "")
                + f" | {verdict(v, limit)} (page cache)"
                + (f", {verdict(m(case, 'mount_s', 'dropped'), limit)} (dropped caches)" if dropped else "") + " |")

    if big_r:
        tg.append(target_row(big_r, "1,024 ranks, cold mount", 1.0))
        tg.append(f"| 1,024 ranks, from the index cache <= 0.1 s | {NO_CACHE} | not measurable |")
    if big_t:
        tg.append(target_row(big_t, "100,000 tensors, cold mount", 5.0))

    # ---- plot ---------------------------------------------------------------------------------------
    series = [("mount_s", "page", "mount (source in page cache)", "C0", "o-")]
    if dropped:
        series.append(("mount_s", "dropped", "mount (dropped caches)", "C0", "o--"))
    series += [("inspect", None, "ckptfs inspect (no tree)", "C1", "s:"),
               ("ls_s", "page", "ls -lR", "C2", "^-"), ("du_s", "page", "du -s", "C3", "v-")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, group, xs, xlabel, target, tlabel in (
            (axes[0], rc, [n[c] for c in rc], "ranks (ZeRO-3, 22 tensors)", 1.0, "target 1,024 ranks: 1 s"),
            (axes[1], tc, [nt[c] for c in tc], "tensors (ZeRO-2, DP 2)", 5.0, "target 100,000 tensors: 5 s")):
        for key, variant, label, color, style in series:
            ys = [med[c, "inspect"] if key == "inspect" else m(c, key, variant) for c in group]
            ax.plot(xs, [max(y, 1e-4) for y in ys], style, color=color, label=label)
        ax.axhline(target, color="grey", linestyle="-.", linewidth=1, label=tlabel)
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
    fig.suptitle(f"bench/scale_bench.sh, {facts['date']}, {facts['nproc']} CPUs; index cache: not implemented yet",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)

    # ---- page ---------------------------------------------------------------------------------------
    mem_gib = int(facts["mem_kib"]) / 1048576
    drop_text = ("**dropped caches**: `sync; echo 3 > /proc/sys/vm/drop_caches` right before each mount, so the "
                 "source files, the binary and its libraries come from disk." if dropped else
                 "dropped caches: not measured (/proc/sys/vm/drop_caches not writable).")
    md = f"""# Scale: mount, `ls -lR` and `du` by ranks and by tensors

Generated by `bash bench/scale_bench.sh [WORKDIR]` (one command, one run; it rewrites this page and
[scale.png](scale.png)) on {facts['date']}: {facts['nproc']} CPUs ({facts['cpu']}), {mem_gib:.1f} GiB memory,
kernel {facts['kernel']}, load average {facts['loadavg']} at the start, WORKDIR on {facts['fs']}, {facts['ckptfs']}.
Every number is the median of {facts['reps']} runs. The bench took {float(facts['bench_s']):.0f} s (fixtures:
{float(facts['gen_s']):.0f} s, generated by `mount_tests/gen/generate.py`, reused while current).

- **mount**: `ckptfs SRC MNT` until it returns with the mount live (index, validate every rank file, build the
  whole tree), each time by a fresh process. "Cold" = no index cache (ckptfs has none yet: that column says
  "{NO_CACHE}"); **page cache**: the source files and the binary are in the page cache (read once before);
  {drop_text}
- **ls -lR** (`ls -lR MNT > /dev/null`, the first walk of the fresh mount) then **du -s** (`du -s MNT`, a second
  walk of the same mount), in the page-cache runs only (the tree is in the daemon's memory: the walks read
  no source file; an earlier run that repeated them after dropping caches measured the same within the
  noise); **tree entries**: `find MNT -mindepth 1 | wc -l` (the root's views and again under `tags/<tag>/`;
  universal/ holds 4 files per trainable parameter plus each rank's model-states file); **daemon CPU in
  ls -lR**: utime + stime of the ckptfs daemon during the ls -lR; **RSS**: the daemon's VmRSS right after
  mounting and its VmHWM after both walks.
- **inspect**: `ckptfs inspect SRC` (index, validation and the merged views, but no tree and no FUSE), for
  comparison with the mount.
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
