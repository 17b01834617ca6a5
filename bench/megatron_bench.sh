#!/usr/bin/env bash
# Benchmark (not a test): ckptfs on a Megatron-LM legacy checkpoint (`--ckpt-format torch`) of a
# Llama-style bf16 model of 2.25 GB (1.124e9 parameters: hidden 2048, ffn 5632, 22 layers, 32 heads in 8
# query groups, vocab 32,000 padded to 32,256), TP=4 x PP=2, non-distributed optimizer (bf16 model, fp32
# masters and both Adam moments in each of the 8 model_optim_rng.pt: ~15.7 GB), against reading the same
# rank files with cat and through the passthrough FUSE floor, all in one run so the ratios compare like
# with like (same machine, same page cache). Numbers are reported, never asserted.
#
#   bash bench/megatron_bench.sh [WORKDIR] [--distopt | --gpt2] [--repeat N]
#                         (default WORKDIR: build/bench; needs root for FUSE mounts and the bdi
#                         readahead knob; CKPTFS_BIN overrides the binary, default build/ckptfs;
#                         --distopt: the distributed-optimizer variant, masters and moments in
#                         distrib_optim.pt beside each model_optim_rng.pt; --gpt2: case bench_gpt2_tp2,
#                         a GPT-2-style TP=2 one-layer bf16 model of hidden 2304 / ffn 9216, ~0.8 GB of
#                         rank files, whose hf/ view is nearly all transposed Conv1D weights;
#                         --repeat N: the first reads of the views N times, default 5, each view
#                         once per repetition in turn, and their medians)
#
# The checkpoint: case bench_llama_tp4_pp2[_distopt] of mount_tests/gen_megatron/megatron_cases.py
# (bench_cases(): not among the cases the tests or generate.py write), written by the generator's own
# write_rank (Debian's /usr/bin/python3, torch 1.13) into WORKDIR/megatron/<case>/checkpoint without
# the expectations or the self-check (~2.5 min and ~16 GB the first time; ~7 GB of memory), and reused
# while WORKDIR/megatron/<case>/checkpoint.complete names the script's SPEC_VERSION, the generator's
# GEN_VERSION and the case.
#
# Prints:
#   - cat of the rank files to /dev/null (warm page cache, best of 3), GB/s;
#   - passthrough_ll (libfuse's example, built into WORKDIR/passthrough_ll as bench/mount_bench.sh does,
#     -o cache=always): first read of the rank files, a fresh mount per file (the mount's page cache and
#     the source's would not both fit in memory for all of them), 1 reader, with the mount's read_ahead_kb
#     at 1024 (what ckptfs sets) and at the kernel default (128);
#   - ckptfs mount (index every pickle + build the tree, until the mount is live), its seconds, the
#     daemon's RSS right after mounting (the catalog's memory) and the bytes it read to index;
#   - first read (cat > /dev/null, fresh mount each) of model.safetensors, fp32/model.safetensors and
#     hf/model.safetensors, each once per repetition, in turn: GB/s, ratios to passthrough_ll's first read
#     and to cat, and the ratio hf/ to model.safetensors of each repetition, as "MEDIAN [MIN-MAX]"; the bytes the daemon
#     read from the rank files for it (rchar of /proc/PID/io, pread) against the view's size and the
#     rank files' total; how much of the rank files was in the page cache before (fincore: other work on
#     the machine can evict them, and then the read waits for the disk); the daemon's VmHWM after the read;
#   - `ckptfs export CKPT OUT` (every view) into WORKDIR: seconds, bytes written, peak RSS (GNU time).
# No dropped-caches variant (bench/dcp_bench.sh has none either): the rank files are read warm throughout.
# The export (~13.5 GB) is written next to the checkpoint last, as it pushes the rank files out of the page
# cache, and deleted right after: peak disk use ~30 GB. Every mount is made under WORKDIR/mnt and
# unmounted on exit, error or signal. Takes ~105 s on 2 CPUs with 23 GiB of memory (plus the
# generation the first time). Run it twice: single runs on a shared machine are noisy.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, readahead, rate, timed_cat, ...
SPEC_VERSION=1  # bump when the generation below changes what it writes
case_name=bench_llama_tp4_pp2
rest=()
for a in "$@"; do
  case $a in
    --distopt) case_name=bench_llama_tp4_pp2_distopt ;;
    --gpt2) case_name=bench_gpt2_tp2 ;;
    *) rest+=("$a") ;;
  esac
done
repeat=5
parse_repeat "${rest[@]}"  # $repeat and $args
bench_setup "${args[0]:-}"  # $work, $bin, $read_timeout, $t_start
case_dir=$work/megatron/$case_name
ckpt=$case_dir/checkpoint
export_dir=$work/megatron/export.$$
mkdir -p "$work/mnt" "$work/megatron"
: >"$work/megatron-ckptfs.log"

# ---- cleanup: every mount made here is unmounted, every daemon started here stopped, outputs removed --
pt_mnt="$work/mnt/megatron-passthrough"
ck_mnt="$work/mnt/megatron-ckptfs"
mounts=("$pt_mnt" "$ck_mnt")
pids=()
cleanup() {
  stop_and_unmount
  rm -rf "$export_dir" "$case_dir.tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rchar_of() { awk '/^rchar/ { print $2 }' "/proc/$1/io"; }
resident() {  # bytes of the rank files in the page cache (util-linux fincore), or "?" without it
  (cd "$ckpt" && fincore -b -n -o RES "${shards[@]}" 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }') ||
    echo "?"
}

# ckptfs in the foreground (so that its VmHWM can be read), in the background of this shell; sets ck_pid
# and ck_mount_s (seconds until the mount is live, polled every 10 ms)
ck_mount() {  # $1: mount point, then extra ckptfs options
  local m=$1 t0
  shift
  fresh_dir "$m"
  t0=$EPOCHREALTIME
  "$bin" "$ckpt" "$m" -f "$@" 2>>"$work/megatron-ckptfs.log" &
  ck_pid=$!
  pids+=("$ck_pid")
  for _ in $(seq 6000); do
    is_mounted "$m" && break
    kill -0 "$ck_pid" 2>/dev/null || { echo "ckptfs exited (log: $work/megatron-ckptfs.log)" >&2; return 1; }
    sleep 0.01
  done
  wait_mounted "$m"
  ck_mount_s=$(since "$t0")
}

# ---- workload: generated once, reused while its stamp names the spec -----------------------------------
# The generator's pieces (components, assemble, cast, write_rank) with one model's values held at a time
# (fp32 masters assembled + the bf16 copy, ~7 GB), no expected/ files, no self-check: the tests check the
# same code on the small cases.
gen_py() {  # spec NAME | generate NAME ROOT
  /usr/bin/python3 - "$@" <<'EOF'
import collections, json, os, sys, time, zlib
sys.path.insert(0, "mount_tests/gen_megatron")
import generate as G  # noqa: E402
from megatron_cases import bench_cases, iter_dir_name  # noqa: E402
cmd, name = sys.argv[1], sys.argv[2]
case = {c["name"]: c for c in bench_cases()}[name]
if cmd == "spec":
    print(json.dumps({"gen": G.GEN_VERSION, "case": case}, sort_keys=True))
    sys.exit(0)
import numpy as np  # noqa: E402


class BenchValues:
    """G.Values without the pieces kept: assembled fp32 masters and their bf16 cast (cast commutes with
    assembling, which only concatenates and reorders)."""

    def __init__(self, case, seed):
        self.master = G.assemble(case, G.components(case, np.random.default_rng(seed)))
        self.model = collections.OrderedDict((k, G.cast(v, case["dtype"])) for k, v in self.master.items())


t0 = time.time()
save_dir = os.path.join(sys.argv[3], "checkpoint")
it = case["iterations"][-1]
tag = iter_dir_name(it)
seed = zlib.crc32(f"{case['name']}/{tag}".encode())
vals = BenchValues(case, seed)
for p in range(case["pp"]):
    for t in range(case["tp"]):
        G.write_rank(case, vals, it, t, p, os.path.join(save_dir, tag, G.rank_dir_name(case, t, p)),
                     seed + 1 + p * case["tp"] + t)
with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
    f.write(str(it))
print(f"  generated in {time.time() - t0:.1f} s")
EOF
}
spec="$SPEC_VERSION $(gen_py spec "$case_name")"
if [ "$(cat "$ckpt.complete" 2>/dev/null)" != "$spec" ]; then
  avail=$(df --output=avail -B1 "$work" | tail -n1)
  [ "$avail" -gt 18000000000 ] || { echo "$(gb "$avail") free under $work; ~18 GB needed" >&2; exit 1; }
  echo "generating $case_name into $ckpt ..."
  rm -rf "$case_dir" "$case_dir.tmp"
  mkdir -p "$case_dir.tmp"
  gen_py generate "$case_name" "$case_dir.tmp"
  mv "$case_dir.tmp" "$case_dir"
  sync  # no writeback of the fresh checkpoint during the timed runs
  echo "$spec" >"$ckpt.complete"
fi
mapfile -t shards < <(cd "$ckpt" && find . -name '*.pt' -printf '%P\n' | sort)
shard_bytes=$(cd "$ckpt" && cat "${shards[@]}" | wc -c)  # also warms the page cache
avail=$(df --output=avail -B1 "$work" | tail -n1)
[ "$avail" -gt 15000000000 ] || { echo "$(gb "$avail") free under $work; ~15 GB needed for the export" >&2; exit 1; }

echo "source: $ckpt ($case_name)"
echo "  ${#shards[@]} rank files, $shard_bytes bytes ($(gb "$shard_bytes"))"
echo "  $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r), $(gb "$avail") free"
echo

t=$(cd "$ckpt" && best_cat "${shards[@]}")
cat_rate=$(rate "$shard_bytes" "$t")
record shard_bytes "$shard_bytes" "$case_name"
record cat_shards_s "$t" "page cache, best of 3"
echo "baseline cat of the rank files > /dev/null (page cache, best of 3):  $cat_rate GB/s" \
  "($(gb "$(resident)") in the page cache after)"

# ---- passthrough_ll, built from the example libfuse ships (the same build as bench/mount_bench.sh) -------
pt_bin="$work/passthrough_ll/passthrough_ll"
build_passthrough_ll "$pt_bin"
declare -A pt
for ra in 1024 0; do  # a fresh mount per file: its page cache cold, the source warm
  total=0
  res_before=$(resident)
  for f in "${shards[@]}"; do
    fresh_dir "$pt_mnt"
    timeout 60 "$pt_bin" -o "source=$ckpt,ro,cache=always" "$pt_mnt"
    wait_mounted "$pt_mnt"
    if [ "$ra" -ne 0 ]; then ra_now=$(set_readahead "$pt_mnt" "$ra"); else ra_now=$(readahead_of "$pt_mnt"); fi
    t=$(timed_cat "$pt_mnt/$f")
    total=$(awk -v a="$total" -v b="$t" 'BEGIN { printf "%.3f", a + b }')
    unmount "$pt_mnt"
  done
  pt[$ra]=$(rate "$shard_bytes" "$total")
  record "passthrough_ll.ra$ra.first_s" "$total" "read_ahead_kb=$ra_now (0: the default), a fresh mount per file"
  echo "baseline passthrough_ll first read, read_ahead_kb=$ra_now, 1 reader:   ${pt[$ra]} GB/s" \
    "($(gb "$res_before") in the page cache before)"
done
echo

# ---- ckptfs: mount (catalog) then first reads through a fresh mount each ------------------------------
ck_mount "$ck_mnt"
rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$ck_pid/status")
index_bytes=$(rchar_of "$ck_pid")
files=$(find "$ck_mnt" | wc -l)
record mount_s "$ck_mount_s" "until live; daemon RSS after mounting $rss KiB"
ck_unmount "$ck_mnt"
echo "ckptfs mount (index ${#shards[@]} pickles, build the tree; until live): ${ck_mount_s} s;" \
  "daemon RSS after mounting $(mib "$rss") (VmHWM $(mib "$ck_hwm")); $((index_bytes / 1024)) KiB read to index;" \
  "$files paths"

hwm_max=0
declare -A res rates
views=(model.safetensors fp32/model.safetensors hf/model.safetensors)
for ((rep = 1; rep <= repeat; rep++)); do
  for view in "${views[@]}"; do
    ck_mount "$ck_mnt"
    file="$ck_mnt/$view"
    bytes=$(size_of "$file")
    ra=$(readahead_of "$ck_mnt")
    res_before=$(resident)
    before=$(rchar_of "$ck_pid")
    t=$(timed_cat "$file")
    read_bytes=$(($(rchar_of "$ck_pid") - before))
    ck_unmount "$ck_mnt"
    hwm=$ck_hwm
    if [ "$hwm" -gt "$hwm_max" ]; then hwm_max=$hwm; fi
    r=$(rate "$bytes" "$t")
    add "$view" "$r"
    record "ckptfs.$view.bytes" "$bytes"
    record "ckptfs.$view.rep$rep.first_s" "$t" "fresh mount; $read_bytes bytes read from the rank files; daemon VmHWM $hwm KiB"
    printf 'ckptfs first read %-22s (repetition %d) %10s bytes, read_ahead_kb=%s, mount %s s: %5s GB/s; / passthrough_ll %s (1024), %s (128); / cat %s\n' \
      "$view" "$rep" "$bytes" "$ra" "$ck_mount_s" "$r" "$(ratio "$r" "${pt[1024]}")" "$(ratio "$r" "${pt[0]}")" \
      "$(ratio "$r" "$cat_rate")"
    echo "  read from the rank files: $read_bytes bytes ($(ratio "$read_bytes" "$bytes") x the view," \
      "$(ratio "$read_bytes" "$shard_bytes") x the rank files; $(gb "$res_before") of them in the page cache before);" \
      "daemon VmHWM $(mib "$hwm")"
    rates[$view]=$r
  done
  add hf_to_model "$(ratio "${rates[hf/model.safetensors]}" "${rates[model.safetensors]}")"
done
for view in "${views[@]}"; do
  echo "ckptfs first read $view over $repeat fresh mounts: $(summary "$view") GB/s (median [min-max])"
done
echo "hf/model.safetensors first read / model.safetensors first read, per repetition: ${res[hf_to_model]};" \
  "median [min-max]: $(summary hf_to_model)"
echo "ckptfs daemon peak RSS over these reads (VmHWM, a fresh daemon per view): $(mib "$hwm_max")"
echo

# ---- ckptfs export: every view, next to the checkpoint (last: it pushes the source out of the cache) ----
rm -rf "$export_dir"
timed_export "$ckpt" "$export_dir" megatron-export
s=$export_s rss=$export_rss bytes=$export_bytes
views=$(cd "$export_dir" && find . -type f -printf '%P\n' | sort | tr '\n' ' ')
rm -rf "$export_dir"
record export_s "$s" "$bytes bytes written; peak RSS $rss KiB"
echo "ckptfs export (every view) to disk: ${s} s, $bytes bytes written ($(rate "$bytes" "$s") GB/s), peak RSS $(mib "$rss")"
echo "  views: $views"
echo
echo "total run time: $(since "$t_start") s"
