#!/usr/bin/env bash
# Benchmark (not a test): the read path under concurrency (issue 18.4), for one binary or two side by side
# (CKPTFS_BEFORE_BIN, e.g. main's build, then CKPTFS_BIN), each mounted afresh, the sources in the page cache:
#   (a) stress: 12 threads for READ_PATH_SECONDS (default 5) over fp32/model.safetensors (spliced from the
#       shards), model.safetensors (bf16 converted from the fp32 masters) and the largest universal/ file of
#       source_reads_z3_dp8 (8 rank files); even threads pread 64 KiB at random with O_DIRECT, odd ones copy
#       64 KiB out of a shared mmap and drop those pages again, so every read reaches the daemon;
#   (b) reopen: one thread opening model.safetensors of scale_z3_dp1024 (a 1,024-rank ZeRO-3 save dir: every
#       open checks the view's sources), reading its first 256 bytes (the header) with O_DIRECT and closing
#       it, in a loop (a 4 KiB range of its tensors reads from ~1,000 rank files: that would time the reads).
# Every byte read is compared with the file as read once before (bench/read_path_load.c; a wrong byte fails
# the bench). Reports reads/s and the daemon's CPU time (utime + stime) over the loop, per read in us.
#
#   bash bench/read_path_bench.sh [WORKDIR]   (default WORKDIR: build/bench; root, for FUSE mounts;
#                                              CKPTFS_BIN: the binary, default build/ckptfs)
#
# Takes ~30 s per binary, plus ~30 s to generate the two cases the first time.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, record, bench_setup
work=$(realpath -m "${1:-build/bench}")
seconds=${READ_PATH_SECONDS:-5}
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'; }
bench_setup  # bin, read_timeout, t_start
bins=("$bin")
labels=(this)
if [ -n "${CKPTFS_BEFORE_BIN:-}" ]; then
  bins=("$(realpath "$CKPTFS_BEFORE_BIN")" "$bin")
  labels=(before after)
fi

mnt="$work/mnt/read_path"
pids=()
mounts=("$mnt")
trap stop_and_unmount EXIT
trap 'exit 130' INT TERM

# ---- workload ------------------------------------------------------------------------------------------
cases=(source_reads_z3_dp8 scale_z3_dp1024)
if ! gen_log=$(/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only "${cases[@]}" 2>&1); then
  echo "$gen_log" >&2
  exit 1
fi
load="$work/read_path_load"
gcc -O2 -pthread -o "$load" bench/read_path_load.c

cpu_seconds() {  # $1: pid; utime + stime (fields 14, 15 of /proc/PID/stat; ckptfs' comm has no spaces)
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}

# Mounts case $2 with binary $1, runs the load `$3 ...` (its file arguments relative to the mount, as
# mnt/...), prints "reads/s cpu_s us_per_read".
measure() {
  local b=$1 src="$work/fixtures/$2/checkpoint" mode=$3 out c0 c1 reads secs
  shift 3
  fresh_dir "$mnt"
  "$b" "$src" "$mnt" -f -o index_cache=off 2>>"$work/read_path-daemon.log" &
  ck_pid=$!
  pids+=("$ck_pid")
  wait_mounted "$mnt"
  local args=()
  for a in "$@"; do args+=("${a/#mnt/$mnt}"); done
  c0=$(cpu_seconds "$ck_pid")
  out=$(timeout "$read_timeout" "$load" "$mode" "$seconds" "${args[@]}") ||
    { echo "$(basename "$b") $mode: $out" >&2; exit 1; }
  c1=$(cpu_seconds "$ck_pid")
  ck_unmount "$mnt"
  read -r _ reads _ _ _ secs <<<"$out"
  awk -v r="$reads" -v s="$secs" -v a="$c0" -v b="$c1" \
    'BEGIN { printf "%.0f %.2f %.1f\n", r / s, b - a, (b - a) * 1e6 / (r > 0 ? r : 1) }'
}

universal_file() {  # the largest file under universal/ of case $1, relative to the mount (mnt/...)
  local b=$1 src="$work/fixtures/$2/checkpoint" f
  fresh_dir "$mnt"
  "$b" "$src" "$mnt" -o index_cache=off
  f=$(find "$mnt/universal" -type f -printf '%s %P\n' | sort -n | tail -1 | cut -d' ' -f2-)
  unmount "$mnt"
  echo "mnt/universal/$f"
}
universal=$(universal_file "$bin" source_reads_z3_dp8)
res="$work/read_path.result"

printf '%-8s %-34s %12s %14s %12s\n' binary workload reads/s "daemon CPU s" "CPU us/read"
for i in "${!bins[@]}"; do
  b=${bins[$i]} label=${labels[$i]}
  measure "$b" source_reads_z3_dp8 stress 12 mnt/fp32/model.safetensors mnt/model.safetensors "$universal" \
    >"$res"
  read -r rps cpu per <"$res"
  printf '%-8s %-34s %12s %14s %12s\n' "$label" "stress, 12 threads mmap/pread" "$rps" "$cpu" "$per"
  record "${label}_stress_reads_per_s" "$rps" "12 threads, mixed mmap/pread, source_reads_z3_dp8"
  record "${label}_stress_cpu_us_per_read" "$per"
  measure "$b" scale_z3_dp1024 reopen mnt/model.safetensors >"$res"
  read -r rps cpu per <"$res"
  printf '%-8s %-34s %12s %14s %12s\n' "$label" "open-pread-close, 1,024 ranks" "$rps" "$cpu" "$per"
  record "${label}_reopen_per_s" "$rps" "open, pread the header, close; scale_z3_dp1024 model.safetensors"
  record "${label}_reopen_cpu_us_per_read" "$per"
done
echo "($seconds s per workload; $(since "$t_start") s in all; daemon stderr: $work/read_path-daemon.log)"
