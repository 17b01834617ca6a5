# shellcheck shell=bash
# Helpers shared by bench/mount_bench.sh and bench/dcp_bench.sh (sourced from the repository root, after
# `set -euo pipefail`): mounts, readahead, times and rates, timed reads, and libfuse's passthrough_ll example
# built as the FUSE baseline. The caller defines read_timeout (seconds for one read pass); since_decimals
# (default 3) sets the precision of since.

is_mounted() { awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo; }
unmount() {  # $1: mount point; quiet when it is not mounted
  if is_mounted "$1"; then
    fusermount3 -u "$1" 2>/dev/null || fusermount3 -uz "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
  fi
}
wait_mounted() {  # $1: mount point; up to 30 s
  for _ in $(seq 300); do
    is_mounted "$1" && return 0
    sleep 0.1
  done
  echo "mount at $1 did not come up" >&2
  return 1
}
fresh_dir() {  # $1: mount point: unmounted (a crashed earlier run may have left it mounted) and present
  unmount "$1"
  mkdir -p "$1"
}
bdi_of() { awk -v m="$1" '$5 == m { print $3 }' /proc/self/mountinfo; }
readahead_of() { cat "/sys/class/bdi/$(bdi_of "$1")/read_ahead_kb"; }
set_readahead() {  # $1: mount point, $2: KiB; prints the value in effect
  echo "$2" >"/sys/class/bdi/$(bdi_of "$1")/read_ahead_kb" 2>/dev/null || true
  readahead_of "$1"
}

# Machine-readable results (bench/run_all.sh collects them for docs/performance.md): with CKPTFS_BENCH_RECORD
# set, appends "BENCH<TAB>KEY<TAB>VALUE<TAB>NOTE" to that file, BENCH being CKPTFS_BENCH_NAME or else the
# script's name without .sh; does nothing otherwise. VALUE is a raw number (seconds, bytes, GB/s): the report
# computes the ratios.
record() {  # KEY VALUE [NOTE]
  [ -n "${CKPTFS_BENCH_RECORD:-}" ] || return 0
  printf '%s\t%s\t%s\t%s\n' "${CKPTFS_BENCH_NAME:-$(basename "$0" .sh)}" "$1" "$2" "${3:-}" \
    >>"$CKPTFS_BENCH_RECORD"
}

since() {  # T0 [DECIMALS]: seconds from $EPOCHREALTIME T0 to now (DECIMALS default: $since_decimals, else 3)
  awk -v a="$1" -v b="$EPOCHREALTIME" -v d="${2:-${since_decimals:-3}}" 'BEGIN { printf "%." d "f", b - a }'
}
rate() {  # BYTES SECONDS [DECIMALS]: GB/s (DECIMALS default 2)
  awk -v b="$1" -v s="$2" -v d="${3:-2}" 'BEGIN { printf "%." d "f", b / s / 1e9 }'
}
gb() { awk -v b="$1" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }
mib() { echo "$(($1 / 1024)) MiB"; }  # KiB -> "N MiB"
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }  # empties the page cache (root)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
size_of() { stat -c %s "$1"; }
timed_cat() {  # files...; prints seconds
  local t0=$EPOCHREALTIME
  # shellcheck disable=SC2154  # read_timeout: the caller's
  timeout "$read_timeout" cat "$@" >/dev/null
  since "$t0"
}
fastest_of_3() {  # command...: one that prints its seconds; prints the fastest of 3 runs (noise is one-sided)
  local t best=
  for _ in 1 2 3; do
    t=$("$@")
    if [ -z "$best" ] || awk -v t="$t" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$t; fi
  done
  echo "$best"
}
best_cat() { fastest_of_3 timed_cat "$@"; }  # files...; page-cache reads

# `ckptfs export SRC OUT` after a sync, timed, under GNU time: sets export_s (seconds), export_rss (peak RSS,
# KiB) and export_bytes (bytes written); its stderr goes to $work/NAME.log, its RSS to $work/NAME.rss.
# shellcheck disable=SC2034  # export_*: the caller's results
timed_export() {  # SRC OUT NAME
  local t0
  sync
  t0=$EPOCHREALTIME
  /usr/bin/time -f '%M' -o "$work/$3.rss" "$bin" export "$1" "$2" 2>"$work/$3.log"
  export_s=$(since "$t0")
  export_rss=$(cat "$work/$3.rss")
  export_bytes=$(find "$2" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s }')
}

# libfuse's passthrough_ll example (/usr/share/doc/libfuse3-dev/examples), built once
build_passthrough_ll() {  # $1: path of the binary to build (its folder gets the sources)
  local bin=$1 dir examples=/usr/share/doc/libfuse3-dev/examples
  [ ! -x "$bin" ] || return 0
  dir=$(dirname "$bin")
  mkdir -p "$dir"
  cp "$examples/passthrough_ll.c" "$examples/passthrough_helpers.h" "$dir/"
  # shellcheck disable=SC2046
  gcc -O2 -o "$bin.tmp" "$dir/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs)
  mv "$bin.tmp" "$bin"
}

# The bench's work dir as $work (the argument, default build/bench), the ckptfs binary under test (CKPTFS_BIN,
# default build/ckptfs) as $bin, the per-pass read limit and the start time, and the tools a bench that
# times processes needs; exits when one is missing.
bench_setup() {  # [WORKDIR]
  work=$(realpath -m "${1:-build/bench}")
  bin=$(realpath "${CKPTFS_BIN:-build/ckptfs}")
  read_timeout=300  # seconds allowed for any single read pass
  t_start=$EPOCHREALTIME
  [ -x "$bin" ] || { echo "no ckptfs binary at $bin (cmake --build build)" >&2; exit 1; }
  [ -x /usr/bin/time ] || { echo "GNU time (/usr/bin/time) is needed" >&2; exit 1; }
}

# Unmounts the ckptfs daemon $ck_pid (listed in the caller's pids array) mounted on $1 and stops it,
# setting ck_hwm to its VmHWM (KiB) first.
ck_unmount() {
  local p kept=()
  ck_hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$ck_pid/status")
  unmount "$1"
  wait "$ck_pid" 2>/dev/null || true
  for p in "${pids[@]}"; do [ "$p" = "$ck_pid" ] || kept+=("$p"); done
  pids=("${kept[@]}")
}

# Stops every daemon in the caller's pids array and unmounts every path in its mounts array (for cleanup
# traps: on exit, error or signal).
stop_and_unmount() {
  local m p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for m in "${mounts[@]}"; do unmount "$m"; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# Sets chroot_dir to the Debian 13 chroot with torch 2.x (CKPTFS_CHROOT, else build/trixie or
# /var/cache/ckptfs/trixie, whichever is set up; mount_tests/modern/setup_chroot.sh makes it); exits when
# there is none.
find_chroot() {
  chroot_dir=${CKPTFS_CHROOT:-}
  if [ -z "$chroot_dir" ]; then
    for c in build/trixie /var/cache/ckptfs/trixie; do
      [ -f "$c/.ckptfs-chroot-complete" ] && { chroot_dir=$c; break; }
    done
  fi
  if [ -z "$chroot_dir" ] || [ ! -f "$chroot_dir/.ckptfs-chroot-complete" ]; then
    echo "no torch 2.x chroot set up (${chroot_dir:-build/trixie, /var/cache/ckptfs/trixie}):" \
      "run bash mount_tests/modern/setup_chroot.sh (or set CKPTFS_CHROOT)" >&2
    exit 1
  fi
  chroot_dir=$(realpath "$chroot_dir")
}

stat_of() { awk -v k="$2" '$1 == k ":" { print $2 }' "/proc/$1/status"; }  # PID KEY: KiB
cpu_of() { awk '{ print $14, $15 }' "/proc/$1/stat"; }  # PID: user and system clock ticks
cpu_since() {  # PID "USER SYSTEM" (cpu_of before): "USER SYSTEM" seconds since
  awk -v h="$(getconf CLK_TCK)" -v b="$2" '{ split(b, t, " "); printf "%.2f %.2f\n", ($14 - t[1]) / h, ($15 - t[2]) / h }' \
    "/proc/$1/stat"
}

# ckptfs -f on SRC at MNT in the background of this shell, its stderr appended to LOG, listed in the caller's
# pids array; sets ck_pid and mount_s (seconds until live)
mount_ckptfs() {  # SRC MNT LOG [OPTIONS...]
  local t0=$EPOCHREALTIME n=0 src=$1 mnt=$2 log=$3
  shift 3
  fresh_dir "$mnt"
  "$bin" "$src" "$mnt" -f -o index_cache=off "$@" 2>>"$log" &
  ck_pid=$!
  pids+=("$ck_pid")
  while ! is_mounted "$mnt"; do
    if ! kill -0 "$ck_pid" 2>/dev/null || [ $((n += 1)) -gt 6000 ]; then echo "no mount (log: $log)" >&2; return 1; fi
    sleep 0.01
  done
  mount_s=$(since "$t0")
}

# Repeated figures in the caller's associative array res: "FIGURE" -> the repetitions' values, space-separated
add() { res[$1]="${res[$1]:-}${res[$1]:+ }$2"; }
summary() {  # FIGURE [DECIMALS]: "MEDIAN [MIN-MAX]" of its repetitions
  tr ' ' '\n' <<<"${res[$1]}" | sort -g | awk -v d="${2:-2}" '{ v[NR] = $1 }
    END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
          printf "%." d "f [%." d "f-%." d "f]", m, v[1], v[NR] }'
}
med() { summary "$@" | cut -d' ' -f1; }

# A bench's arguments: --repeat N (or --repeat=N) into $repeat, whose default the caller sets first; the
# others, in order, into the array $args. Exits 2 on a repeat count that is not a positive number.
parse_repeat() {  # ARGS...
  args=()
  while [ $# -gt 0 ]; do
    case $1 in
      --repeat) repeat=${2:?--repeat needs a number}; shift 2 ;;
      --repeat=*) repeat=${1#--repeat=}; shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "--repeat N: a positive number, not '$repeat'" >&2; exit 2; }
}
