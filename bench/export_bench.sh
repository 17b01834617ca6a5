#!/usr/bin/env bash
# Benchmark (not a test): `ckptfs inspect` time and `ckptfs export` throughput on a generated ZeRO-3
# checkpoint of 64 data-parallel ranks (>= 1 GB of fp32 master weights), against `cat` of the same
# source shards, all in one run so the ratios compare like with like (same machine, same page cache).
#
#   bash bench/export_bench.sh [WORKDIR]        (default WORKDIR: build/bench)
#
# Prints: inspect wall time; export bytes written, seconds, GB/s and peak RSS; cat of the optimizer shards
# to /dev/null and to a file (GB/s); cat of export's own output to a file (GB/s: writing the same bytes
# without merging); the ratios. Two thirds of the generated shards' bytes are zero pages (Adam moments
# of a fresh optimizer), which some virtual disks write much faster than data, so on a disk the
# "same output bytes" baseline is the fair one; /dev/shm shows the engine without the disk.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib_bench.sh  # record
work=${1:-build/bench}
bin=${CKPTFS_BIN:-build/ckptfs}
mkdir -p "$work"
/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 >/dev/null
src="$work/fixtures/bench_z3_dp64/checkpoint"
tag_dir=$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -n1)
shards=("$tag_dir"/*_optim_states.pt)
shard_bytes=$(cat "${shards[@]}" | wc -c)   # also warms the page cache for every run below

now() { date +%s.%N; }

t0=$(now); "$bin" inspect "$src" >/dev/null; t1=$(now)
inspect_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')

# Export and the write-inclusive cat baseline go to the same target: WORKDIR (disk) and /dev/shm (memory,
# which shows the engine's own speed once the disk is out of the way).
measure() {  # $1: output dir; sets export_s, export_bytes, rss_kb, cat_file_s, rewrite_s
  rm -rf "$1" "$1.copy"
  local t0 t1
  sync  # every timed writer starts with no dirty pages left by an earlier one
  t0=$(now)
  /usr/bin/time -f '%M' -o "$work/export.rss" "$bin" export "$src" "$1"
  t1=$(now)
  export_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  export_bytes=$(find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
  rss_kb=$(cat "$work/export.rss")
  mkdir -p "$1.copy"
  sync
  t0=$(now); find "$1" -type f -exec cat {} + >"$1.copy/all"; t1=$(now)
  rewrite_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  rm -rf "$1" "$1.copy"
  mkdir -p "$1"
  sync
  t0=$(now); cat "${shards[@]}" >"$1/cat.out"; t1=$(now)
  cat_file_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  rm -rf "$1"
}

t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
cat_null_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')

echo "source: $src (64 optimizer shards, $shard_bytes bytes)"
echo "inspect: ${inspect_s} s"
echo "cat shards > /dev/null: $(rate "$shard_bytes" "$cat_null_s") GB/s"
record inspect_s "$inspect_s"
record cat_null_s "$cat_null_s" "$shard_bytes bytes"
targets=("$work/out")
[ -d /dev/shm ] && targets+=("/dev/shm/ckptfs-bench.$$")
for out in "${targets[@]}"; do
  measure "$out"
  e=$(rate "$export_bytes" "$export_s"); f=$(rate "$shard_bytes" "$cat_file_s")
  where=disk; [[ $out != /dev/shm/* ]] || where=shm
  record "$where.export_s" "$export_s" "$export_bytes bytes written, peak RSS $rss_kb KiB"
  record "$where.export_bytes" "$export_bytes"
  record "$where.export_rss_kib" "$rss_kb"
  record "$where.cat_export_output_to_file_s" "$rewrite_s"
  record "$where.cat_shards_to_file_s" "$cat_file_s"
  w=$(rate "$export_bytes" "$rewrite_s")
  echo "into $out:"
  echo "  export: $export_bytes bytes written in ${export_s} s = $e GB/s, peak RSS $((rss_kb / 1024)) MiB"
  echo "  cat shards > file: $f GB/s   cat export output > file: $w GB/s"
  awk -v e="$e" -v f="$f" -v w="$w" -v n="$(rate "$shard_bytes" "$cat_null_s")" \
    'BEGIN { printf "  ratio export/cat-output-to-file: %.2f   export/cat-shards-to-file: %.2f   export/cat-to-null: %.2f\n", e / w, e / f, e / n }'
done
