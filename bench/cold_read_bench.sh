#!/usr/bin/env bash
# Benchmark (not a test): first read of merged views with the sources on disk, not in the page cache
# (issue 10's cold case), with and without prefetching (-o prefetch=MB), against the disk's sequential rate
# for the shards, measured in the same run. Checkpoint: the generated 64-rank ZeRO-3 bf16 one of
# bench/mount_bench.sh (bench_z3_dp64: 128 shard files, ~3.2 GB; fp32 masters 1.08 GB).
#
#   bash bench/cold_read_bench.sh [WORKDIR] [REPS]   (default build/bench, 2; root: drop_caches and FUSE)
#
# Every pass starts with `sync; echo 3 > /proc/sys/vm/drop_caches` (the whole machine's page cache), then:
#   - cat of every shard file to /dev/null: the disk's sequential rate for these files (GB/s);
#   - a fresh ckptfs mount (index cache off: every mount parses), cat of fp32/model.safetensors and, after
#     dropping the caches again, of model.safetensors: GB/s of the view's own bytes, and the ratio to the
#     shards' rate (1.0 = the view is produced as fast as the disk delivers the bytes it needs);
# for prefetch=0 (off), the default (32) and 128. Numbers are reported, never asserted.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh
reps=${2:-2}
bench_setup "${1:-}"  # $work, $bin, $read_timeout, $t_start
[ -w /proc/sys/vm/drop_caches ] || { echo "needs a writable /proc/sys/vm/drop_caches (root)" >&2; exit 1; }
/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 >/dev/null
src="$work/fixtures/bench_z3_dp64/checkpoint"
mnt="$work/mnt/cold-read"
mounts=("$mnt")
pids=()
cleanup() { stop_and_unmount; }
trap cleanup EXIT
trap 'exit 130' INT TERM
mapfile -t shards < <(find "$src" -name '*.pt' | sort)
shard_bytes=$(du -cb "${shards[@]}" | tail -1 | cut -f1)
record shard_bytes "$shard_bytes"
echo "checkpoint: $src, ${#shards[@]} shard files, $shard_bytes bytes; load average $(cut -d' ' -f1-3 /proc/loadavg)"

view_pass() {  # $1: prefetch MB, $2: view; prints "seconds bytes"
  drop
  fresh_dir "$mnt"
  "$bin" "$src" "$mnt" -o "prefetch=$1,index_cache=off" >/dev/null
  local bytes t0 s
  bytes=$(size_of "$mnt/$2")
  t0=$EPOCHREALTIME
  timeout "$read_timeout" cat "$mnt/$2" >/dev/null
  s=$(since "$t0")
  unmount "$mnt"
  echo "$s $bytes"
}

printf '%-4s %-26s %10s %12s %8s %10s\n' rep what seconds bytes GB/s "/ shards"
for rep in $(seq 1 "$reps"); do
  drop
  t=$(timed_cat "${shards[@]}")
  disk=$(rate "$shard_bytes" "$t")
  record "rep$rep.cat_shards_s" "$t" "${#shards[@]} files, caches dropped"
  printf '%-4s %-26s %10s %12s %8s %10s\n' "$rep" "cat of the shards" "$t" "$shard_bytes" "$disk" 1.00
  for pf in 0 32 128; do
    for view in fp32/model.safetensors model.safetensors; do
      read -r s bytes < <(view_pass "$pf" "$view")
      record "$view.bytes" "$bytes"
      r=$(rate "$bytes" "$s")
      record "rep$rep.prefetch$pf.$view.s" "$s" "caches dropped, fresh mount"
      printf '%-4s %-26s %10s %12s %8s %10s\n' "$rep" "prefetch=$pf $view" "$s" "$bytes" "$r" "$(ratio "$r" "$disk")"
    done
  done
done
echo "total run time: $(since "$t_start") s"
