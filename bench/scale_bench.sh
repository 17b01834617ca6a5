#!/usr/bin/env bash
# Benchmark (not a test): how mount and metadata walks grow with the number of ranks and of tensors, in one
# run. Generated checkpoints (mount_tests/gen/generate.py):
#   - rank sweep: ZeRO-3 bf16, the tiny 22-tensor model, DP 8 / 64 / 512 / 1,024
#     (scale_z3_dp8, scale_z3_dp64, scale_z3_dp512, scale_z3_dp1024: 2 files per rank);
#   - tensor sweep: ZeRO-2 bf16, DP 2, 20,480 and 100,000 small trainable params (many_params_z2_dp2,
#     many_params_100k_z2_dp2: 20,483 and 100,003 tensors; universal/ holds 4 files per parameter and
#     tags/<tag>/ repeats the root's views, so ~1,000,000 tree entries for the 100,000-tensor case).
# For every case, 3 times each (the tables give the median):
#   - cold mount: `ckptfs SRC MNT -o index_cache=DIR` until it returns (index, validate, build the tree,
#     mount live), by a fresh process, with DIR a fresh, empty index cache: what a first mount does (the
#     daemon writes the index after that, while it serves; the bench waits for it before the walks); the
#     source files in the page cache;
#   - `ls -lR MNT > /dev/null`, then `du -s MNT` (a second walk, same mount), after the cold mount;
#   - the daemon's RSS right after mounting and its peak (VmHWM) after both walks, and the CPU seconds the
#     daemon spent serving the ls -lR (utime + stime);
#   - the mount with `-o index_cache=off` (parses, writes no index), for comparison;
#   - the mount from the index cache: `-o index_cache=DIR` with the DIR a cold mount filled; every such
#     mount is checked to have loaded the index (its file keeps inode, mtime and size: a mount that parsed
#     would have rewritten it), and once per case a `-f` mount must print "ckptfs: index loaded from";
#   - the index file's size, `ckptfs index SRC --cache DIR` (parse and write the index, into an empty DIR)
#     and `ckptfs inspect SRC` (index + views, no tree, no FUSE, no index cache) for comparison;
#   - once: the number of tree entries (find MNT -mindepth 1 | wc -l);
#   - when /proc/sys/vm/drop_caches is writable (root, not a read-only /proc): the cold mount and the mount
#     from the index cache again after `sync; echo 3 > /proc/sys/vm/drop_caches` (the source files, the
#     index, the binary and its libraries come from disk; drops the page cache of the whole machine). The
#     walks are not repeated there: the tree is in the daemon's memory and they read no source file (a
#     first run that repeated them measured the same times within the noise, and took 10 minutes).
# The load average at the start and the end and the share of CPU time that niced (background) processes
# took during the run are recorded: the machine need not be idle.
# Writes docs/scale.md (table, machine facts, growth per case, targets) and docs/scale.png
# (bench/scale_plot.py, python3-matplotlib, Agg) and prints the table; raw numbers in WORKDIR/scale/.
#
#   bash bench/scale_bench.sh [WORKDIR]     (default WORKDIR: build/bench; root, for FUSE mounts and
#                                           drop_caches; CKPTFS_BIN overrides the binary, default
#                                           build/ckptfs; SCALE_REPS overrides the 3 repetitions)
#
# Every mount is made under WORKDIR/mnt/scale and unmounted on exit, error or signal; the index caches are
# WORKDIR/scale/index/<case>/. Takes ~8 min on 2 CPUs (the 100,000-tensor case takes most of it), plus
# ~40 s to generate the fixtures the first time.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir
since_decimals=4  # mount times are sub-millisecond
work=$(realpath -m "${1:-build/bench}")
bin=$(realpath "${CKPTFS_BIN:-build/ckptfs}")
reps=${SCALE_REPS:-3}
walk_timeout=600  # seconds allowed for any one ls -lR / du / find
t_start=$EPOCHREALTIME

[ -x "$bin" ] || { echo "no ckptfs binary at $bin (cmake --build build)" >&2; exit 1; }
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  { echo "python3-matplotlib is needed for the plot (bash .ci/install-deps installs it)" >&2; exit 1; }


out="$work/scale"
mnt="$work/mnt/scale"
mkdir -p "$out" "$work/mnt"
rm -f "$out/cases.tsv.tmp"

# ---- cleanup: the mount made here is unmounted, the daemon started here stopped -----------------------
daemon=
cleanup() {
  unmount "$mnt"
  if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- workload ----------------------------------------------------------------------------------------
rank_cases=(scale_z3_dp8 scale_z3_dp64 scale_z3_dp512 scale_z3_dp1024)
tensor_cases=(many_params_z2_dp2 many_params_100k_z2_dp2)
cases=("${rank_cases[@]}" "${tensor_cases[@]}")
t0=$EPOCHREALTIME
if ! gen_log=$(/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only "${cases[@]}" 2>&1); then
  echo "$gen_log" >&2
  exit 1
fi
gen_s=$(since "$t0")

dropped=no
if sync && { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; then dropped=yes; fi
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
nice_ticks() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print $3, t; exit }' /proc/stat; }
read -r nice0 total0 < <(nice_ticks)

# ---- machine facts -----------------------------------------------------------------------------------
{
  printf 'date\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
  printf 'nproc\t%s\n' "$(nproc)"
  printf 'cpu\t%s\n' "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  printf 'mem_kib\t%s\n' "$(awk '/^MemTotal/ { print $2 }' /proc/meminfo)"
  printf 'kernel\t%s\n' "$(uname -r)"
  printf 'loadavg\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'fs\t%s\n' "$(df -T "$work" | awk 'NR == 2 { print $2 }')"
  printf 'ckptfs\t%s\n' "$("$bin" --version 2>&1 | head -n1)"
  printf 'reps\t%s\n' "$reps"
  printf 'dropped\t%s\n' "$dropped"
  printf 'gen_s\t%s\n' "$gen_s"
} >"$out/facts.tsv"
echo "$(nproc) CPUs, $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), load average" \
  "$(cut -d' ' -f1-3 /proc/loadavg); fixtures in ${gen_s}s; drop_caches: $dropped"

printf 'case\tvariant\trep\tmount_s\tls_s\tdu_s\trss_mount_kib\thwm_kib\tdaemon_cpu_ls_s\tindex_bytes\n' \
  >"$out/runs.tsv"
printf 'case\trep\tinspect_s\tindex_s\n' >"$out/inspect.tsv"
printf 'case\tranks\ttensors\ttrainable\tuniversal_files\tsource_files\tsource_bytes\tentries\n' >"$out/cases.tsv"
printf 'case\tstderr\n' >"$out/verify.tsv"
ticks=$(getconf CLK_TCK)
cpu_of() { awk -v t="$ticks" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' "/proc/$1/stat"; }
kib_of() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }
fail() { echo "$*" >&2; return 1; }

# The index cache of case $1 (a fresh, empty one when $2 is "empty").
cache_of() {
  local dir="$out/index/$1"
  if [ "${2:-}" = empty ]; then rm -rf "$dir" && mkdir -p "$dir"; fi
  echo "$dir"
}
# "inode mtime size" of the one index file in cache dir $1; nothing when there is none.
index_stat() {
  local files=("$1"/*.index)
  if [ "${#files[@]}" -eq 1 ] && [ -f "${files[0]}" ]; then stat -c '%i %.9Y %s' "${files[0]}"; fi
}
# The arguments of a mount of case $1 with index cache $2 (a dir, or off) on $mnt.
mount_args() { args=("$work/fixtures/$1/checkpoint" "$mnt" -o "index_cache=$2"); }

# One mount of case $1; $2: variant:
#   page     cold (a fresh, empty index cache), source in the page cache; then ls -lR and du -s;
#   dropped  cold, caches dropped just before the mount;
#   off      -o index_cache=off, source in the page cache;
#   cached   from the index cache the cold mounts filled, source and index in the page cache;
#   cached_dropped  the same, caches dropped just before the mount.
# $3: repetition. Appends a line to runs.tsv; leaves the mount up. A mount from the index cache that
# rewrote the index (so it parsed) is an error.
measure() {
  local name=$1 variant=$2 rep=$3 cache=off before='' after='' t0 mount_s ls_s='' du_s='' rss hwm c0 cpu_ls=''
  local args
  case $variant in
    page | dropped) cache=$(cache_of "$name" empty) ;;
    cached*) cache=$(cache_of "$name"); before=$(index_stat "$cache")
      [ -n "$before" ] || fail "$name: no index in $cache for a mount from the index cache" ;;
  esac
  mount_args "$name" "$cache"
  fresh_dir "$mnt"
  if [[ $variant == *dropped ]]; then drop_caches; fi
  t0=$EPOCHREALTIME
  "$bin" "${args[@]}"
  mount_s=$(since "$t0")
  is_mounted "$mnt" || fail "ckptfs returned but $mnt is not mounted"
  daemon=$(pgrep -xf "$bin ${args[*]}" | head -n1)
  [ -n "$daemon" ] || fail "no ckptfs daemon found for $mnt"
  rss=$(kib_of "$daemon" VmRSS)
  if [ "$cache" != off ]; then
    # The daemon writes the index once the mount is live: wait for it (the walks then run alone).
    for ((i = 0; i < 6000; i++)); do
      after=$(index_stat "$cache")
      [ -z "$after" ] || break
      sleep 0.1
    done
    [ -n "$after" ] || fail "$name ($variant): the mount wrote no index into $cache within 600 s"
    [ -z "$before" ] || [ "$before" = "$after" ] ||
      fail "$name ($variant): the mount rewrote the index (it parsed the sources): $before -> $after"
  fi
  if [ "$variant" = page ]; then
    c0=$(cpu_of "$daemon")
    t0=$EPOCHREALTIME
    timeout "$walk_timeout" ls -lR "$mnt" >/dev/null
    ls_s=$(since "$t0")
    cpu_ls=$(awk -v a="$c0" -v b="$(cpu_of "$daemon")" 'BEGIN { printf "%.2f", b - a }')
    t0=$EPOCHREALTIME
    timeout "$walk_timeout" du -s "$mnt" >/dev/null
    du_s=$(since "$t0")
  fi
  hwm=$(kib_of "$daemon" VmHWM)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$variant" "$rep" "$mount_s" "$ls_s" "$du_s" \
    "$rss" "$hwm" "$cpu_ls" "${after##* }" >>"$out/runs.tsv"
  record "$name.$variant.rep$rep.mount_s" "$mount_s"
  printf '  %-24s %-14s #%s  mount %7.3f s  ls -lR %8s s  du -s %7s s  RSS %7d KiB  peak %7d KiB  index %9s B\n' \
    "$name" "$variant" "$rep" "$mount_s" "${ls_s:--}" "${du_s:--}" "$rss" "$hwm" "${after##* }"
}
stop_daemon() {  # unmount and wait for the daemon to exit (its memory freed before the next mount)
  unmount "$mnt"
  if [ -n "$daemon" ]; then
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill "$daemon" 2>/dev/null || true
    daemon=
  fi
}
measure_reps() {  # $1: case, $2: variant; $reps mounts, each unmounted
  local rep
  for rep in $(seq "$reps"); do
    measure "$1" "$2" "$rep"
    stop_daemon
  done
}
# A mount of case $1 from its index cache in the foreground (-f, in the background here), untimed: its
# first stderr line must say that it loaded the index. Appends the line to verify.tsv.
verify_loaded() {
  local name=$1 args line
  mount_args "$name" "$(cache_of "$name")"
  fresh_dir "$mnt"
  "$bin" "${args[@]}" -f 2>"$out/$name.verify.log" &
  daemon=$!
  wait_mounted "$mnt"
  unmount "$mnt"
  wait "$daemon" || true
  daemon=
  line=$(head -n1 "$out/$name.verify.log")
  printf '%s\t%s\n' "$name" "$line" >>"$out/verify.tsv"
  echo "  $name: -f mount from the index cache: $line"
  [[ $line == "ckptfs: index loaded from "* ]] || fail "$name: the -f mount did not load the index"
}

for name in "${cases[@]}"; do
  src="$work/fixtures/$name/checkpoint"
  "$bin" inspect "$src" --json >"$out/$name.inspect.json"
  /usr/bin/python3 - "$out/$name.inspect.json" "$name" "$(du -sb "$src" | cut -f1)" >>"$out/cases.tsv.tmp" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
t = [t for t in j["tags"] if t["name"] == j["latest"]][0]
uni = [v["files"] for v in t["views"] if v["path"] == "universal/"]
print(sys.argv[2], t["topology"]["dp"], t["tensor_count"]["model"], t["tensor_count"].get("exp_avg", 0),
      uni[0] if uni else 0, t["source_files"], sys.argv[3], sep="\t", end="")
PY
  find "$src" -type f -exec cat {} + >/dev/null  # source in the page cache ...
  cat "$bin" >/dev/null                          # ... and the binary
  for rep in $(seq "$reps"); do
    measure "$name" page "$rep"
    if [ "$rep" -eq 1 ]; then
      printf '\t%s\n' "$(timeout "$walk_timeout" find "$mnt" -mindepth 1 | wc -l)" >>"$out/cases.tsv.tmp"
    fi
    stop_daemon
  done
  measure_reps "$name" off
  measure_reps "$name" cached
  verify_loaded "$name"
  scratch="$out/index/$name.scratch"
  for rep in $(seq "$reps"); do
    t0=$EPOCHREALTIME
    "$bin" inspect "$src" >/dev/null
    inspect_s=$(since "$t0")
    rm -rf "$scratch"
    t0=$EPOCHREALTIME
    "$bin" index "$src" --cache "$scratch" >/dev/null
    printf '%s\t%s\t%s\t%s\n' "$name" "$rep" "$inspect_s" "$(since "$t0")" >>"$out/inspect.tsv"
  done
  rm -rf "$scratch"
  if [ "$dropped" = yes ]; then
    measure_reps "$name" dropped
    measure_reps "$name" cached_dropped
  fi
done
cat "$out/cases.tsv.tmp" >>"$out/cases.tsv"
rm -f "$out/cases.tsv.tmp"
read -r nice1 total1 < <(nice_ticks)
{
  printf 'bench_s\t%s\n' "$(since "$t_start")"
  printf 'loadavg_end\t%s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'nice_cpu_share\t%s\n' "$(awk -v a=$((nice1 - nice0)) -v b=$((total1 - total0)) 'BEGIN { printf "%.2f", a / b }')"
} >>"$out/facts.tsv"

/usr/bin/python3 bench/scale_plot.py "$out" docs/scale.md docs/scale.png
echo
sed -n '/^<!-- table -->$/,/^<!-- end table -->$/p' docs/scale.md | grep -v '^<!--'
echo "wrote docs/scale.md and docs/scale.png in $(since "$t_start") s (raw numbers: $out)"
