#!/usr/bin/env bash
# Every benchmark in one go, and one report: docs/performance.md (a table of ratios, each ckptfs figure
# against its baseline measured in the same run, the issue's targets marked met / not met) and its plots
# docs/performance-*.png (bench/performance_report.py, python3-matplotlib). Numbers are reported, never
# asserted: a bench that fails is recorded, shown in the report, and the run goes on.
#
#   bash bench/run_all.sh [WORKDIR]
#   DEEPSPEED_SRC=DIR bash bench/run_all.sh [WORKDIR]     (with the zero_to_fp32 comparison)
#
#   WORKDIR  default build/bench (the benches' own default: their fixtures are reused); root is needed
#            (FUSE mounts, drop_caches, chroot). DIR: a DeepSpeed checkout or a bare git dir of one, for
#            bench/zero_to_fp32_bench.sh (without it that row says "not run (set DEEPSPEED_SRC)").
#   CKPTFS_BIN  the binary under test (default build/ckptfs); it is copied to WORKDIR/run_all/ckptfs first and
#            every bench runs that copy, so a rebuild during the run changes nothing.
#   RANK_SWEEP  the rank counts of the rank sweep (default "8 32 64 256 1024").
#   RUN_ALL_ONLY  names of the benches to run (e.g. "mount_bench rank_sweep"); the others are recorded as
#            skipped and the report says so. For trying things out: the report is then a partial one.
#
# Runs, in this order, each with its log in WORKDIR/run_all/<bench>.log and a time limit: mount_bench,
# export_bench, universal_bench, loader_bench, dcp_bench, cold_read_bench (2 reps), zero_to_fp32_bench,
# megatron_bench, the rank sweep (below), latency_bench (2 reps), scale_bench. Each bench appends its raw
# numbers to WORKDIR/run_all/records.tsv (CKPTFS_BENCH_RECORD, `record` in bench/lib_bench.sh); this script
# adds the machine's facts (CPUs, memory, kernel, load average before and after every bench, date) and each
# bench's exit status and seconds, then runs bench/performance_report.py. The benches that write their own
# pages rewrite them: docs/scale.md + docs/scale.png (scale_bench) and docs/latency-bench.md (latency_bench).
#
# The rank sweep (`bash bench/run_all.sh --rank-sweep [WORKDIR]` alone): the 64-rank bench checkpoint's model
# (bench_z3_dp64 of mount_tests/gen/generate.py: 1.08 GB of fp32 masters, ZeRO-3 bf16) saved at each rank
# count of RANK_SWEEP by the generator's own generate_bench (into WORKDIR/rank_sweep/, synced, deleted after
# its measurement unless RANK_SWEEP_KEEP=1; 64 ranks is WORKDIR/fixtures/bench_z3_dp64). Per rank count: the
# mount's seconds (-o index_cache=off, sources warm); first read of fp32/model.safetensors and of
# model.safetensors (best of 3 fresh mounts each, sources warm) against cat of the optimizer shards (page
# cache, best of 3); then cold: the shard files' cat after drop_caches (the disk's rate) and the fp32 view's
# first read after drop_caches. ~30 s per rank count, most of it generating.
#
# Takes ~20-30 min on 2 CPUs (scale_bench ~8 min, megatron_bench ~2 min, the rank sweep ~2.5 min), plus the
# fixtures' generation the first time (the Megatron checkpoint: ~3 min, 16 GB). Peak disk use ~35 GB
# (megatron_bench's checkpoint and export). Every mount is unmounted at the end; a mount a bench left under
# WORKDIR or the chroot's /tmp is unmounted and reported.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, rate, timed_cat, best_cat, record, ...

# ---- the rank sweep (its own process: bash bench/run_all.sh --rank-sweep WORKDIR) -----------------------
rank_sweep() {
  local dp ckpt case_dir gen_root mnt t t0 s view_bytes view_gbs first_mount_s keep=${RANK_SWEEP_KEEP:-0}
  local -a optim all
  bench_setup "${1:-}"  # $work, $bin, $read_timeout, $t_start
  [ -w /proc/sys/vm/drop_caches ] || { echo "needs a writable /proc/sys/vm/drop_caches (root)" >&2; exit 1; }
  gen_root=$work/rank_sweep
  mnt=$work/mnt/rank-sweep
  mkdir -p "$gen_root" "$work/mnt"
  mounts=("$mnt")
  pids=()
  trap 'stop_and_unmount' EXIT
  trap 'exit 130' INT TERM
  warm_first_read() {  # $1: record name, $2: view; the best of 3 first reads, each on a fresh mount (as in
    # mount_bench.sh: a first read's newly allocated page cache may have to be faulted in by the VM's host);
    # sets view_bytes, view_gbs, first_mount_s (the first mount's seconds)
    local -a firsts=()
    for pass in 1 2 3; do
      mount_view
      [ "$pass" != 1 ] || first_mount_s=$mount_s
      view_bytes=$(size_of "$mnt/$2")
      firsts+=("$(timed_cat "$mnt/$2")")
      unmount "$mnt"
    done
    t=$(printf '%s\n' "${firsts[@]}" | sort -g | head -1)
    record "dp$dp.$1.bytes" "$view_bytes"
    record "dp$dp.$1.warm_s" "$t" "first read, sources warm; best of 3 fresh mounts: ${firsts[*]} s"
    view_gbs=$(rate "$view_bytes" "$t")
  }
  mount_view() {  # fresh mount of $ckpt (index_cache=off: it parses); sets mount_s
    fresh_dir "$mnt"
    t0=$EPOCHREALTIME
    timeout 300 "$bin" "$ckpt" "$mnt" -o index_cache=off
    mount_s=$(since "$t0")
    wait_mounted "$mnt"
  }
  printf '%6s %7s %13s %9s %9s %10s %10s %10s %10s %10s\n' ranks files "shard bytes" "mount s" "cat GB/s" \
    "fp32 warm" "model warm" "disk GB/s" "fp32 cold" "gen s"
  for dp in ${RANK_SWEEP:-8 32 64 256 1024}; do
    t0=$EPOCHREALTIME
    if [ "$dp" = 64 ]; then
      /usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 >/dev/null 2>&1 ||
        /usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64
      case_dir=$work/fixtures/bench_z3_dp64
    else
      case_dir=$gen_root/bench_z3_dp$dp
      /usr/bin/python3 bench/bench_checkpoint.py "$dp" "$case_dir"
    fi
    sync  # no writeback of a freshly generated checkpoint during the timed reads
    gen_s=$(since "$t0")
    ckpt=$case_dir/checkpoint
    mapfile -t optim < <(find "$ckpt" -name '*_optim_states.pt' | sort)
    mapfile -t all < <(find "$ckpt" -name '*.pt' | sort)
    optim_bytes=$(du -cb "${optim[@]}" | tail -1 | cut -f1)
    all_bytes=$(du -cb "${all[@]}" | tail -1 | cut -f1)
    masters=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["fp32_master_bytes"])' \
      "$case_dir/case.json")
    record "dp$dp.files" "${#all[@]}"
    record "dp$dp.optim_bytes" "$optim_bytes"
    record "dp$dp.shard_bytes" "$all_bytes"
    record "dp$dp.fp32_master_bytes" "$masters"
    record "dp$dp.generate_s" "$gen_s"
    # warm: the sources in the page cache
    cat "${all[@]}" >/dev/null
    t=$(best_cat "${optim[@]}")
    record "dp$dp.cat_optim_warm_s" "$t" "page cache, best of 3"
    cat_gbs=$(rate "$optim_bytes" "$t")
    warm_first_read fp32 fp32/model.safetensors
    fp32_bytes=$view_bytes fp32_warm=$view_gbs warm_mount_s=$first_mount_s
    record "dp$dp.mount_s" "$warm_mount_s" "-o index_cache=off, sources warm"
    warm_first_read model model.safetensors
    model_warm=$view_gbs
    # cold: the disk's rate for these files, then the fp32 view's first read
    drop
    t=$(timed_cat "${all[@]}")
    record "dp$dp.cat_all_cold_s" "$t" "every shard file, caches dropped"
    disk_gbs=$(rate "$all_bytes" "$t")
    drop
    mount_view
    t=$(timed_cat "$mnt/fp32/model.safetensors")
    record "dp$dp.fp32.cold_s" "$t" "first read, caches dropped before the mount"
    record "dp$dp.fp32.cold_mount_s" "$mount_s"
    fp32_cold=$(rate "$fp32_bytes" "$t")
    unmount "$mnt"
    printf '%6s %7s %13s %9s %9s %10s %10s %10s %10s %10s\n' "$dp" "${#all[@]}" "$all_bytes" "$warm_mount_s" \
      "$cat_gbs" "$fp32_warm" "$model_warm" "$disk_gbs" "$fp32_cold" "$gen_s"
    if [ "$dp" != 64 ] && [ "$keep" != 1 ]; then rm -rf "$case_dir"; fi
  done
  echo "(GB/s of each file's own bytes; the report computes the ratios on the fp32 masters' bytes)"
  echo "total run time: $(since "$t_start") s"
}
if [ "${1:-}" = --rank-sweep ]; then
  shift
  rank_sweep "$@"
  exit 0
fi

# ---- the whole run ---------------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || { echo "run as root (FUSE mounts, drop_caches, chroot)" >&2; exit 1; }
# the plots need python3-matplotlib, peak memory GNU time: installed now, not found missing after 20 minutes
{ /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && [ -x /usr/bin/time ]; } || bash .ci/install-deps
work=$(realpath -m "${1:-build/bench}")
out=$work/run_all
mkdir -p "$out"
t_all=$EPOCHREALTIME
command_line="bash bench/run_all.sh${1:+ $1}"
[ -z "${DEEPSPEED_SRC:-}" ] || command_line="DEEPSPEED_SRC=$DEEPSPEED_SRC $command_line"
[ -z "${RANK_SWEEP:-}" ] || command_line="RANK_SWEEP=\"$RANK_SWEEP\" $command_line"
[ -z "${RUN_ALL_ONLY:-}" ] || command_line="RUN_ALL_ONLY=\"$RUN_ALL_ONLY\" $command_line"

# the binary under test, copied once (mtime kept)
bin_src=$(realpath "${CKPTFS_BIN:-build/ckptfs}")
[ -x "$bin_src" ] || { echo "no ckptfs binary at $bin_src (cmake --build build)" >&2; exit 1; }
cp -p "$bin_src" "$out/ckptfs.tmp"
mv "$out/ckptfs.tmp" "$out/ckptfs"
export CKPTFS_BIN=$out/ckptfs
export CKPTFS_BENCH_RECORD=$out/records.tsv
: >"$CKPTFS_BENCH_RECORD"
rm -f "$out"/*.log

# bench/lib_bench.sh's record names the bench after $0; these lines are this script's
fact() { record "$@"; }
fact command "$command_line"
fact date_start "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
fact nproc "$(nproc)"
fact cpu "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
fact mem_kib "$(awk '/^MemTotal/ { print $2 }' /proc/meminfo)"
fact kernel "$(uname -r)"
fact os "$(. /etc/os-release && echo "$PRETTY_NAME")"
fact loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg)"
fact workdir "$work"
fact workdir_fs "$(df --output=source,fstype "$work" | tail -n1 | tr -s ' ')"
fact workdir_free_bytes "$(df --output=avail -B1 "$work" | tail -n1 | tr -d ' ')"
fact binary "${bin_src#"$PWD/"}" "copied to $CKPTFS_BIN"
fact binary_sha256 "$(sha256sum "$bin_src" | cut -c1-16)"
fact binary_mtime "$(date -u -r "$bin_src" '+%Y-%m-%d %H:%M UTC')"
fact binary_version "$("$bin_src" --version 2>&1 | head -n1)"
fact git_head "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" "$(git log -1 --format=%s 2>/dev/null | cut -c1-100)"
fact git_src_changed "$(git status --porcelain -- src 2>/dev/null | wc -l)" "files of src/ changed or new at the start"
fact deepspeed_src "${DEEPSPEED_SRC:-}"
chroot_facts=$(
  for c in "${CKPTFS_CHROOT:-}" build/trixie /var/cache/ckptfs/trixie; do
    if [ -n "$c" ] && [ -f "$c/.ckptfs-chroot-complete" ]; then
      echo "$(realpath "$c"): $(tr '\n' ' ' <"$c/.ckptfs-chroot-complete")"
      break
    fi
  done
)
fact chroot "${chroot_facts:-none}"

# mounts under WORKDIR or a bench folder in a chroot's /tmp (FUSE and bind): "mount point" lines
our_mounts() {
  awk -v w="$work/" 'index($5, w) == 1 || $5 ~ "/tmp/ckptfs-[a-z0-9-]*-bench/" { print $5 }' /proc/self/mountinfo |
    sort
}
mounts_before=$(our_mounts)
if [ -z "$mounts_before" ]; then
  fact mounts_at_start 0
else
  fact mounts_at_start "$(wc -l <<<"$mounts_before")" "$(tr '\n' ' ' <<<"$mounts_before")"
fi

# the shared checkpoint, generated up front (not inside a bench's time), and the bytes its views are made from
echo "generating the fixtures (once; reused later) ..."
if ! gen_log=$(/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 2>&1); then
  echo "$gen_log" >&2
  exit 1
fi
fact bench_z3_dp64.shard_bytes "$(find "$work/fixtures/bench_z3_dp64/checkpoint" -name '*.pt' -printf '%s\n' |
  awk '{ s += $1 } END { printf "%.0f", s }')" "its 128 shard files"
fact bench_z3_dp64.fp32_master_bytes "$(/usr/bin/python3 -c \
  'import json,sys; print(json.load(open(sys.argv[1]))["fp32_master_bytes"])' "$work/fixtures/bench_z3_dp64/case.json")" \
  "the fp32 master weights every merged view of bench_z3_dp64 is made from"

# benchmark or test processes of other sessions: they share the page cache (drop_caches) and the CPUs
sid=$(ps -o sid= -p $$ | tr -d ' ')
others() {
  ps -eo sid=,args= | awk -v s="$sid" '$1 != s && $0 ~ /bench\/[a-z_0-9]+\.(sh|py)|pytest|mount_tests\// {
    $1 = ""; sub(/^ /, ""); print substr($0, 1, 80) }' | sort | uniq -c | awk '{ $1 = $1 "x"; print }' |
    paste -sd';' -
}
child=
stop_child() {
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
}
trap 'stop_child; exit 130' INT TERM

# $1: name (the log's), $2: time limit (s), then the command
run_bench() {
  local name=$1 limit=$2 t0 rc=0 s left
  shift 2
  if [ -n "${RUN_ALL_ONLY:-}" ] && [[ " $RUN_ALL_ONLY " != *" $name "* ]]; then
    skip_bench "$name" "not run (RUN_ALL_ONLY)"
    return 0
  fi
  local log=$out/$name.log
  fact "bench.$name.loadavg_before" "$(cut -d' ' -f1-3 /proc/loadavg)"
  fact "bench.$name.others_before" "$(others)"
  printf '%-20s ' "$name"
  t0=$EPOCHREALTIME
  CKPTFS_BENCH_NAME=$name timeout -k 60 "$limit" "$@" >"$log" 2>&1 &
  child=$!
  wait "$child" || rc=$?
  child=
  s=$(since "$t0")
  fact "bench.$name.rc" "$rc" "$([ "$rc" -ne 124 ] || echo "timed out after $limit s")"
  fact "bench.$name.s" "$s"
  fact "bench.$name.loadavg_after" "$(cut -d' ' -f1-3 /proc/loadavg)"
  fact "bench.$name.others_after" "$(others)"
  # a mount the bench left behind: reported, then unmounted
  left=$(comm -13 <(echo "$mounts_before") <(our_mounts) || true)
  if [ -n "$left" ]; then
    fact "bench.$name.left_mounts" "$(wc -l <<<"$left")" "$(tr '\n' ' ' <<<"$left")"
    while read -r m; do
      unmount "$m"
      if is_mounted "$m"; then umount -l "$m" 2>/dev/null || true; fi
    done <<<"$left"
  fi
  if [ "$rc" -eq 0 ]; then echo "ok      ${s} s"; else echo "FAILED  rc $rc, ${s} s (log: $log)"; fi
}
skip_bench() {  # $1: name, $2: why
  fact "bench.$1.rc" skipped "$2"
  printf '%-20s skipped: %s\n' "$1" "$2"
}

run_bench mount_bench 900 bash bench/mount_bench.sh "$work"
run_bench export_bench 900 bash bench/export_bench.sh "$work"
run_bench universal_bench 900 bash bench/universal_bench.sh "$work"
run_bench loader_bench 1200 bash bench/loader_bench.sh "$work"
run_bench dcp_bench 1200 bash bench/dcp_bench.sh "$work"
run_bench cold_read_bench 1200 bash bench/cold_read_bench.sh "$work" 2
if [ -n "${DEEPSPEED_SRC:-}" ]; then
  run_bench zero_to_fp32_bench 1200 bash bench/zero_to_fp32_bench.sh "$work"
else
  skip_bench zero_to_fp32_bench "not run (set DEEPSPEED_SRC)"
fi
run_bench megatron_bench 1800 bash bench/megatron_bench.sh "$work"
run_bench fsdp_local_bench 900 bash bench/fsdp_local_bench.sh "$work"
run_bench gguf_bench 900 bash bench/gguf_bench.sh "$work"
run_bench rank_sweep 2400 bash bench/run_all.sh --rank-sweep "$work"
run_bench latency_bench 1800 bash bench/latency_bench.sh "$work" 2
run_bench scale_bench 2400 bash bench/scale_bench.sh "$work"

fact loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"
fact date_end "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
left=$(comm -13 <(echo "$mounts_before") <(our_mounts) || true)
if [ -z "$left" ]; then fact mounts_left_at_end 0; else fact mounts_left_at_end "$(wc -l <<<"$left")" "$(tr '\n' ' ' <<<"$left")"; fi
fact total_s "$(since "$t_all")"

echo "writing docs/performance.md ..."
/usr/bin/python3 bench/performance_report.py "$out" docs/performance.md
echo "total run time: $(since "$t_all") s; records: $CKPTFS_BENCH_RECORD; logs: $out/*.log"
if grep fuse /proc/mounts | grep -F "$work/"; then echo "FUSE mounts left under $work (above)" >&2; fi
