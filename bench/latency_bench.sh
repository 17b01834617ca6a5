#!/usr/bin/env bash
# Benchmark (not a test): first (cold) read of a merged view with the sources on slow storage, a stand-in
# for network storage (Lustre/NFS) made from libfuse's passthrough_ll example with an added delay per read
# request, against a plain `cat` of the shard files through the same slow mount, in the same run; and the
# same two reads with the sources on the local disk, to show what the latency costs. Numbers are reported,
# never asserted (the issue's target: with 1 ms per source I/O, the view's first read at >= 0.5x the rate
# of that cat).
#
#   bash bench/latency_bench.sh [WORKDIR] [REPS]     (default build/bench, 2; root: FUSE and drop_caches)
#   DELAY_US=N    microseconds each read request waits in the slow layer (default 1000)
#   LATENCY_DOC=F where the report goes (default docs/latency-bench.md; "-": none)
#
# Checkpoint: the generated 64-rank ZeRO-3 bf16 one of bench/cold_read_bench.sh (bench_z3_dp64 of
# mount_tests/gen/generate.py: 128 shard files, 3.24 GB; fp32/model.safetensors 1.21 GB, made from the
# fp32 masters, ~1/3 of the optimizer-state files' bytes). Takes ~1.5 min on 2 CPUs with the default REPS
# (~2.2 min with 3).
#
# The slow layer: passthrough_ll.c copied from /usr/share/doc/libfuse3-dev/examples into
# WORKDIR/passthrough_ll_slow and patched there (never committed): its read handler sleeps DELAY_US
# (nanosleep, a -D define) before serving, then serves as before; it counts the read requests, their
# bytes, how many were in flight at once (the most, and the busy time summed over requests) and prints
# the running totals on SIGUSR1 and at exit (stderr, WORKDIR/latency-slow.log), so the requests of one
# timed read are the difference of two snapshots. It runs multithreaded (the example's default loop: at
# most 10 worker threads, so at most 10 delayed requests at once), `-o source=DIR,ro,cache=auto`.
# cache=auto (the example's default) and not cache=never: an NFS or Lustre client has a page cache and
# kernel readahead, and cache=never sets direct_io, which turns both off (each read(2) becomes requests of
# its own size, and there is no page cache for ckptfs's posix_fadvise(WILLNEED) to fill for its reads), so
# it would measure a storage that cannot be read ahead at all. Every timed read starts with
# `sync; echo 3 > /proc/sys/vm/drop_caches` instead, which empties the slow mount's page cache and the
# local disk's: every byte pays the delay and the disk.
#
# Passes (each REP; every mount fresh, caches dropped before mounting and again before the timed read):
#   - slow: cat of every shard file through the slow mount, one cat, in sorted order (GB/s of the shards);
#   - slow: ckptfs on top of the slow mount (`ckptfs SLOWMNT/checkpoint CKMNT -o
#     prefetch=N,index_cache=off`, N = 0, 32 (the default), 128), cat of fp32/model.safetensors: GB/s of
#     the view's bytes, ratio to the slow cat's GB/s;
#   - local: the same cat of the shards and the same ckptfs reads with the sources on the local disk.
# Every ckptfs daemon runs under that shim (WORKDIR/passthrough_ll_slow/fadvise_shim.so, built at bench
# time), which counts the WILLNEED calls and forwards each unchanged (same syscall as glibc's). After the
# passes: what one WILLNEED call of 32 MiB fetches through the slow mount.
# For every pass: seconds, bytes, GB/s, ratio; for ckptfs the mount's seconds (index every pickle, until
# live), the bytes fetched from the sources during the read (slow: the bytes the slow layer served; local:
# the shard files' bytes in the page cache after it, fincore), its WILLNEED calls, MiB advised and MiB
# beyond the first read_ahead_kb of their call; for the slow passes the slow layer's requests (count, MiB,
# mean KiB, most in flight, mean in flight = summed busy time / read time). With lib_bench.sh's `record`
# (CKPTFS_BENCH_RECORD) each pass's seconds are recorded too.
# Then a table of medians, written with the run's facts to LATENCY_DOC.
# Every mount is made under WORKDIR/mnt and unmounted on exit, error or signal.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, readahead_of, rate, ratio, ...
reps=${2:-2}
delay_us=${DELAY_US:-1000}
doc=${LATENCY_DOC:-docs/latency-bench.md}
command_line="bash bench/latency_bench.sh${1:+ $1}${2:+ $2}"
[ "$delay_us" = 1000 ] || command_line="DELAY_US=$delay_us $command_line"
bench_setup "${1:-}"  # $work, $bin, $read_timeout, $t_start
[ -w /proc/sys/vm/drop_caches ] || { echo "needs a writable /proc/sys/vm/drop_caches (root)" >&2; exit 1; }
command -v fincore >/dev/null || { echo "util-linux fincore is needed" >&2; exit 1; }
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "REPS must be a positive number, not '$reps'" >&2; exit 2; }
[[ $delay_us =~ ^[0-9]+$ ]] || { echo "DELAY_US must be a number of microseconds, not '$delay_us'" >&2; exit 2; }
/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 >/dev/null
case_dir="$work/fixtures/bench_z3_dp64"  # the slow layer's source; the checkpoint is its checkpoint/
src="$case_dir/checkpoint"
view=fp32/model.safetensors
slow_mnt="$work/mnt/latency-slow"
ck_mnt="$work/mnt/latency-ckptfs"
slow_log="$work/latency-slow.log"
ck_log="$work/latency-ckptfs.log"
mkdir -p "$work/mnt"
: >"$ck_log"

# ---- cleanup: ckptfs (on top) first, then the slow layer under it --------------------------------------
mounts=("$ck_mnt" "$slow_mnt")
pids=()
cleanup() {
  unmount "$ck_mnt"
  stop_and_unmount
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rec() { if declare -F record >/dev/null; then record "$@"; fi; }  # lib_bench.sh's record, where it has one
resident() {  # bytes of the local shard files in the page cache (util-linux fincore)
  (cd "$src" && fincore -b -n -o RES "${shard_names[@]}" | awk '{ s += $1 } END { printf "%.0f", s }')
}
# The median of the numbers on stdin, with as many decimals as the most precise of them ("-" if any is "-")
median() {
  sort -g | awk '{ v[NR] = $1; if ($1 == "-") dash = 1; d = index($1, ".") ? length($1) - index($1, ".") : 0
                   if (d > dec) dec = d }
    END { if (dash || NR == 0) { print "-"; exit }
          m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf("%." dec + 0 "f\n", m) }'
}

# ---- the slow layer: passthrough_ll with a delay per read request ---------------------------------------
# Copies the example into the binary's folder, patches the copy (a wrapper around lo_read: count, sleep,
# serve) and compiles it with -DDELAY_US; rebuilt when the delay or the patch changes.
build_slow_passthrough() {  # $1: path of the binary, $2: delay in microseconds
  local bin=$1 delay=$2 dir examples=/usr/share/doc/libfuse3-dev/examples stamp
  dir=$(dirname "$bin")
  stamp="delay=$delay patch=1 $(md5sum <"$examples/passthrough_ll.c" | cut -d' ' -f1)"
  [ -x "$bin" ] && [ "$(cat "$bin.stamp" 2>/dev/null)" = "$stamp" ] && return 0
  mkdir -p "$dir"
  cp "$examples/passthrough_ll.c" "$examples/passthrough_helpers.h" "$dir/"
  /usr/bin/python3 - "$dir/passthrough_ll.c" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
def once(old, new):
    global text
    if text.count(old) != 1:
        sys.exit(f"patching {path}: expected one '{old}', found {text.count(old)}")
    text = text.replace(old, new)
# the example's handler becomes lo_read_served; lo_read (the name lo_oper uses) wraps it
once("static void lo_read(fuse_req_t req, fuse_ino_t ino, size_t size,",
     "static void lo_read_served(fuse_req_t req, fuse_ino_t ino, size_t size,")
wrapper = r'''
/* ---- added by ckptfs bench/latency_bench.sh: DELAY_US per read request, and counters ---- */
#include <signal.h>
#include <time.h>
#ifndef DELAY_US
#define DELAY_US 1000
#endif
static unsigned long slow_reads, slow_bytes, slow_inflight, slow_max_inflight, slow_busy_ns;

static unsigned long slow_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (unsigned long)t.tv_sec * 1000000000UL + (unsigned long)t.tv_nsec;
}

/* running totals, one line on stderr: on SIGUSR1 (snapshots) and at exit */
static void slow_report(int sig)
{
	char line[256];
	int n = snprintf(line, sizeof(line),
		"slowfs delay_us=%d reads=%lu bytes=%lu max_inflight=%lu busy_ns=%lu\n", DELAY_US,
		__atomic_load_n(&slow_reads, __ATOMIC_RELAXED), __atomic_load_n(&slow_bytes, __ATOMIC_RELAXED),
		__atomic_load_n(&slow_max_inflight, __ATOMIC_RELAXED),
		__atomic_load_n(&slow_busy_ns, __ATOMIC_RELAXED));
	(void) sig;
	if (n > 0 && write(2, line, (size_t) n) < 0)
		return;
}

__attribute__((constructor)) static void slow_init(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = slow_report;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
}

__attribute__((destructor)) static void slow_fini(void)
{
	slow_report(0);
}

static void lo_read(fuse_req_t req, fuse_ino_t ino, size_t size,
		    off_t offset, struct fuse_file_info *fi)
{
	unsigned long t0 = slow_now_ns();
	unsigned long now = __atomic_add_fetch(&slow_inflight, 1, __ATOMIC_RELAXED);
	unsigned long most = __atomic_load_n(&slow_max_inflight, __ATOMIC_RELAXED);
	struct timespec delay = { DELAY_US / 1000000, (DELAY_US % 1000000) * 1000L };

	while (now > most && !__atomic_compare_exchange_n(&slow_max_inflight, &most, now, 1,
							   __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	while (nanosleep(&delay, &delay) == -1 && errno == EINTR)
		;
	lo_read_served(req, ino, size, offset, fi);
	__atomic_add_fetch(&slow_reads, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&slow_bytes, size, __ATOMIC_RELAXED);
	__atomic_add_fetch(&slow_busy_ns, slow_now_ns() - t0, __ATOMIC_RELAXED);
	__atomic_sub_fetch(&slow_inflight, 1, __ATOMIC_RELAXED);
}
/* ---- end of the bench's addition ---- */

static void lo_write_buf('''
once("\nstatic void lo_write_buf(", wrapper)
if "lo_read_buf" in text:
    sys.exit(f"patching {path}: this version has lo_read_buf, which the patch does not delay")
open(path, "w").write(text)
EOF
  # shellcheck disable=SC2046
  gcc -O2 -Wall -DDELAY_US="$delay" -o "$bin.tmp" "$dir/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs)
  mv "$bin.tmp" "$bin"
  echo "$stamp" >"$bin.stamp"
}
slow_bin="$work/passthrough_ll_slow/passthrough_ll_slow"
build_slow_passthrough "$slow_bin" "$delay_us"

# ---- posix_fadvise shim (LD_PRELOAD into ckptfs): counts the WILLNEED calls ckptfs makes and the bytes they
# advise beyond FADV_CHUNK (the kernel fetches at most the file's readahead size per call, see the report).
# Forwards each call to the same syscall glibc's posix_fadvise makes; writes its totals to FADV_STATS when the
# daemon exits.
build_fadvise_shim() {  # $1: path of the library
  local lib=$1
  [ -f "$lib" ] && [ "$(cat "$lib.stamp" 2>/dev/null)" = "shim=2" ] && return 0
  mkdir -p "$(dirname "$lib")"
  cat >"$lib.c" <<'EOF'
/* bench/latency_bench.sh: posix_fadvise(WILLNEED) counted (calls, bytes, bytes beyond FADV_CHUNK in a
   call); totals appended to FADV_STATS at exit. Every call is forwarded unchanged. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static long long chunk = 131072;
static unsigned long long calls, bytes, over, beyond;

__attribute__((constructor)) static void shim_init(void)
{
	const char *c = getenv("FADV_CHUNK");
	if (c && atoll(c) > 0)
		chunk = atoll(c);
}

__attribute__((destructor)) static void shim_report(void)
{
	const char *path = getenv("FADV_STATS");
	FILE *f = path ? fopen(path, "a") : NULL;
	if (!f)
		return;
	fprintf(f, "fadvise calls=%llu bytes=%llu over_chunk=%llu beyond_chunk=%llu chunk=%lld\n",
		calls, bytes, over, beyond, chunk);
	fclose(f);
}

static int advise(int fd, off_t off, off_t len, int advice)
{
	return syscall(SYS_fadvise64, fd, off, len, advice) == 0 ? 0 : errno;
}

int posix_fadvise(int fd, off_t off, off_t len, int advice)
{
	if (advice != POSIX_FADV_WILLNEED || len <= 0)
		return advise(fd, off, len, advice);
	__atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&bytes, (unsigned long long) len, __ATOMIC_RELAXED);
	if (len > chunk) {
		__atomic_add_fetch(&over, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&beyond, (unsigned long long) (len - chunk), __ATOMIC_RELAXED);
	}
	return advise(fd, off, len, advice);
}
EOF
  gcc -O2 -Wall -shared -fPIC -o "$lib.tmp" "$lib.c"
  mv "$lib.tmp" "$lib"
  echo "shim=2" >"$lib.stamp"
}
shim="$work/passthrough_ll_slow/fadvise_shim.so"
build_fadvise_shim "$shim"
fadv_stats="$work/latency-fadvise.stats"

# Mounts the slow layer (foreground, in the background of this shell: its counters go to $slow_log); sets
# slow_pid
slow_mount() {
  fresh_dir "$slow_mnt"
  : >"$slow_log"
  "$slow_bin" -f -o "source=$case_dir,ro,cache=auto" "$slow_mnt" 2>>"$slow_log" &
  slow_pid=$!
  pids+=("$slow_pid")
  wait_mounted "$slow_mnt"
  slow_ra=$(readahead_of "$slow_mnt")
}
slow_unmount() {
  local p kept=()
  unmount "$slow_mnt"
  wait "$slow_pid" 2>/dev/null || true
  for p in "${pids[@]}"; do [ "$p" = "$slow_pid" ] || kept+=("$p"); done
  pids=("${kept[@]}")
}
# The slow layer's running totals now: "reads bytes max_inflight busy_ns"
slow_snapshot() {
  local lines
  lines=$(grep -c '^slowfs ' "$slow_log" || true)
  kill -USR1 "$slow_pid"
  for _ in $(seq 500); do
    [ "$(grep -c '^slowfs ' "$slow_log" || true)" -gt "$lines" ] && break
    sleep 0.01
  done
  grep '^slowfs ' "$slow_log" | tail -n1 |
    sed -E 's/.* reads=([0-9]+) bytes=([0-9]+) max_inflight=([0-9]+) busy_ns=([0-9]+).*/\1 \2 \3 \4/'
}
# ckptfs in the foreground, in the background of this shell, with the fadvise shim; sets ck_pid and ck_mount_s
ck_mount() {  # $1: checkpoint, $2: prefetch MB, $3: FADV_CHUNK (bytes)
  local t0
  fresh_dir "$ck_mnt"
  : >"$fadv_stats"
  t0=$EPOCHREALTIME
  LD_PRELOAD=$shim FADV_CHUNK=$3 FADV_STATS=$fadv_stats \
    "$bin" "$1" "$ck_mnt" -f -o "prefetch=$2,index_cache=off" 2>>"$ck_log" &
  ck_pid=$!
  pids+=("$ck_pid")
  for _ in $(seq 30000); do
    is_mounted "$ck_mnt" && break
    kill -0 "$ck_pid" 2>/dev/null || { echo "ckptfs exited (log: $ck_log)" >&2; return 1; }
    sleep 0.01
  done
  wait_mounted "$ck_mnt"
  ck_mount_s=$(since "$t0")
}

mapfile -t shard_names < <(cd "$src" && find . -name '*.pt' -printf '%P\n' | sort)
shard_bytes=$(cd "$src" && du -cb "${shard_names[@]}" | tail -1 | cut -f1)
optim_bytes=$(cd "$src" && find . -name '*optim_states.pt' -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s }')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
bin_facts="$(date -u -r "$bin" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$bin" | cut -c1-12)"
tree_facts=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
changed=$(git status --porcelain -- src 2>/dev/null | wc -l)
[ "$changed" -eq 0 ] || tree_facts="$tree_facts with $changed file(s) of src/ changed or new"
date_start=$(date -u '+%Y-%m-%d %H:%M UTC')
local_dev=$(df --output=source "$src" | tail -n1)
local_ra=$(readahead_of "$(df --output=target "$src" | tail -n1)")
slow_ra="?"
rec shard_bytes "$shard_bytes" "${#shard_names[@]} files"
echo "checkpoint: $src, ${#shard_names[@]} shard files, $shard_bytes bytes" \
  "($optim_bytes in the optimizer-state files); view $view"
echo "slow layer: $slow_bin, DELAY_US=$delay_us per read request; $(nproc) CPUs, load average $load_start"

# ---- one pass: sets out to "seconds bytes source_bytes mount_s reads req_bytes max_inflight busy_ns
# fadvise_calls fadvise_bytes fadvise_beyond_bytes" (what a pass does not measure is "-"); in this shell, not a subshell,
# so that the cleanup knows its daemons
pass() {  # $1: slow|local, $2: cat|ckptfs, $3: prefetch MB (ckptfs)
  local where=$1 what=$2 pf=${3:-} root=$src t0 s bytes=$shard_bytes src_bytes=- mount_s=-
  local r0 b0 m0 u0 r1 b1 m1 u1 stats="- - - -" fadv="- - -" chunk_kb=$local_ra
  drop
  if [ "$where" = slow ]; then
    slow_mount
    root="$slow_mnt/checkpoint"
    chunk_kb=$slow_ra
  fi
  if [ "$what" = ckptfs ]; then
    ck_mount "$root" "$pf" $((chunk_kb * 1024))
    bytes=$(size_of "$ck_mnt/$view")
  fi
  drop
  [ "$where" = slow ] && read -r r0 b0 m0 u0 < <(slow_snapshot)
  if [ "$what" = ckptfs ]; then
    t0=$EPOCHREALTIME
    timeout "$read_timeout" cat "$ck_mnt/$view" >/dev/null
    s=$(since "$t0")
    mount_s=$ck_mount_s
    ck_unmount "$ck_mnt"
    fadv=$(sed -nE 's/^fadvise calls=([0-9]+) bytes=([0-9]+) .* beyond_chunk=([0-9]+) .*/\1 \2 \3/p' "$fadv_stats")
    [ -n "$fadv" ] || { echo "no fadvise counts from the shim ($fadv_stats)" >&2; exit 1; }
  else
    t0=$EPOCHREALTIME
    (cd "$root" && timeout "$read_timeout" cat "${shard_names[@]}" >/dev/null)
    s=$(since "$t0")
  fi
  # bytes fetched from the sources during the read: what the slow layer served, or what of the local shard
  # files is in the page cache now (it was dropped right before the read)
  if [ "$where" = slow ]; then
    read -r r1 b1 m1 u1 < <(slow_snapshot)
    # the most in flight is over the mount's life (the ckptfs mount's indexing reads are serial)
    stats="$((r1 - r0)) $((b1 - b0)) $m1 $((u1 - u0))"
    src_bytes=$((b1 - b0))
    : "$m0"
    slow_unmount
  else
    src_bytes=$(resident)
  fi
  out="$s $bytes $src_bytes $mount_s $stats $fadv"
}

results="$work/latency-bench.results"
: >"$results"
fmt='%-4s %-6s %-24s %8s %8s %11s %11s %6s %5s %6s %5s %8s %6s %7s %5s %8s %13s\n'
header=(rep source what mount_s read_s bytes src_bytes GB/s ratio reads MiB mean_KiB max_if mean_if fadv fadv_MiB fadv_lost_MiB)
# shellcheck disable=SC2059
printf "$fmt" "${header[@]}"
for rep in $(seq 1 "$reps"); do
  for where in slow local; do
    pass "$where" cat
    read -r s bytes src_bytes mount_s n req_bytes max_if busy fcalls fbytes fbeyond <<<"$out"
    base=$(rate "$bytes" "$s" 3)
    rows=("cat of the shards|$s|$bytes|$src_bytes|$mount_s|$n|$req_bytes|$max_if|$busy|$fcalls|$fbytes|$fbeyond")
    for pf in 0 32 128; do
      pass "$where" ckptfs "$pf"
      what="ckptfs prefetch=$pf"
      read -r s bytes src_bytes mount_s n req_bytes max_if busy fcalls fbytes fbeyond <<<"$out"
      rows+=("$what|$s|$bytes|$src_bytes|$mount_s|$n|$req_bytes|$max_if|$busy|$fcalls|$fbytes|$fbeyond")
    done
    for row in "${rows[@]}"; do
      IFS='|' read -r what s bytes src_bytes mount_s n req_bytes max_if busy fcalls fbytes fbeyond <<<"$row"
      r=$(rate "$bytes" "$s" 3)
      if [ "$n" = - ]; then
        mib=- kib=- mean_if=-
      else
        mib=$((req_bytes >> 20))
        kib=$(awk -v b="$req_bytes" -v n="$n" 'BEGIN { printf "%.0f", n ? b / n / 1024 : 0 }')
        mean_if=$(awk -v u="$busy" -v s="$s" 'BEGIN { printf "%.2f", u / 1e9 / s }')
      fi
      [ "$fbeyond" = - ] || { fbytes=$((fbytes >> 20)); fbeyond=$((fbeyond >> 20)); }
      line=("$rep" "$where" "$what" "$mount_s" "$s" "$bytes" "$src_bytes" "$r" "$(ratio "$r" "$base")" "$n" "$mib"
        "$kib" "$max_if" "$mean_if" "$fcalls" "$fbytes" "$fbeyond")
      # shellcheck disable=SC2059
      printf "$fmt" "${line[@]}"
      (IFS='|'; echo "${line[*]}") >>"$results"
      key=cat_shards
      [ "$what" = "cat of the shards" ] || key="${what#ckptfs }.$view" key=${key/=/}
      rec "rep$rep.$where.$key.s" "$s" "$bytes bytes; $src_bytes fetched from the sources; caches dropped, DELAY_US=$delay_us"
    done
  done
done

# ---- probe: what one posix_fadvise(WILLNEED) of the prefetch window fetches through the slow layer --------
# (ckptfs's prefetch is one such call per source file and range): requests and bytes the slow layer got
drop
slow_mount
probe_file="$slow_mnt/checkpoint/$(printf '%s\n' "${shard_names[@]}" | grep optim_states | head -n1)"
read -r r0 b0 _ _ < <(slow_snapshot)
/usr/bin/python3 -c 'import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 32 << 20, os.POSIX_FADV_WILLNEED)
time.sleep(1)  # the readahead it starts is asynchronous
os.close(fd)' "$probe_file"
read -r r1 b1 _ _ < <(slow_snapshot)
probe_reads=$((r1 - r0)) probe_kib=$(((b1 - b0) >> 10))
slow_unmount
echo "one posix_fadvise(WILLNEED) of 32 MiB on a shard through the slow mount (read_ahead_kb $slow_ra):" \
  "$probe_reads read request(s), $probe_kib KiB"

total_s=$(since "$t_start")
echo "total run time: $total_s s"

# ---- medians over the reps, and the report ----------------------------------------------------------------
col() {  # $1: where, $2: what, $3: field number of the results line; the median over the reps
  awk -F'|' -v w="$1" -v t="$2" -v f="$3" '$2 == w && $3 == t { print $f }' "$results" | median
}
all() {  # the same, every rep's value, comma-separated
  awk -F'|' -v w="$1" -v t="$2" -v f="$3" '$2 == w && $3 == t { printf "%s%s", sep, $f; sep = ", " }' "$results"
}
slow_label="slow (${delay_us} us/read)"
summary=$(
  echo "| source | read | view or shard bytes | bytes fetched from the sources | mount s | read s (each rep) | GB/s (median) | ratio to cat, same source | slow-layer requests, mean KiB | most / mean in flight | WILLNEED calls, MiB advised, MiB past the bound |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for where in slow local; do
    for what in "cat of the shards" "ckptfs prefetch=0" "ckptfs prefetch=32" "ckptfs prefetch=128"; do
      label=$what
      [ "$what" = "cat of the shards" ] || label="$what, cat $view"
      req=- inflight=- fadv=-
      if [ "$where" = slow ]; then
        req="$(col "$where" "$what" 10), $(col "$where" "$what" 12)"
        inflight="$(col "$where" "$what" 13) / $(col "$where" "$what" 14)"
      fi
      [ "$what" = "cat of the shards" ] ||
        fadv="$(col "$where" "$what" 15), $(col "$where" "$what" 16), $(col "$where" "$what" 17)"
      printf '| %s | %s | %s | %s | %s | %s | %s | **%s** | %s | %s | %s |\n' \
        "$([ "$where" = slow ] && echo "$slow_label" || echo "local disk")" "$label" \
        "$(col "$where" "$what" 6)" "$(col "$where" "$what" 7)" "$(col "$where" "$what" 4)" \
        "$(all "$where" "$what" 5)" "$(col "$where" "$what" 8)" "$(col "$where" "$what" 9)" "$req" "$inflight" "$fadv"
    done
  done
)
echo
echo "$summary"

# A paragraph of facts from the medians: requests, time per request inside the slow layer, overlap
where_the_time_goes() {
  local what n s mif per floor pf0 pf32 pf128 best
  fact() {  # $1: what; sets n (requests), s (read s), mif (mean in flight), per (ms per request inside the
    # slow layer: delay + serving), floor (s the delay alone costs at that overlap)
    n=$(col slow "$1" 10) s=$(col slow "$1" 5) mif=$(col slow "$1" 14)
    per=$(awk -v s="$s" -v m="$mif" -v n="$n" 'BEGIN { printf "%.2f", s * m / n * 1000 }')
    floor=$(awk -v n="$n" -v d="$delay_us" -v m="$mif" 'BEGIN { printf "%.1f", n * d / 1e6 / m }')
  }
  fact "cat of the shards"
  echo "- **The slow cat** sent $n read requests of $(col slow "cat of the shards" 12) KiB on average (the"
  echo "  slow mount's kernel readahead), $mif in flight on average (most $(col slow "cat of the shards" 13)):"
  echo "  one sequential reader's readahead keeps fewer than two outstanding. Each spent $per ms"
  echo "  inside the slow layer (the ${delay_us} us delay, then the splice from the cold disk), so the delay alone"
  echo "  costs ~$floor s of its $s s (requests x delay / mean in flight). On the local disk the same cat took"
  echo "  $(col local "cat of the shards" 5) s."
  for what in "ckptfs prefetch=0" "ckptfs prefetch=32" "ckptfs prefetch=128"; do
    fact "$what"
    echo "- **$what**: $n requests of $(col slow "$what" 12) KiB on average for the"
    echo "  $(col slow "$what" 7) bytes it fetched ($(ratio "$(col slow "$what" 7)" "$shard_bytes") x the cat's), $mif in flight on average (most"
    echo "  $(col slow "$what" 13)), $per ms each inside the slow layer: the delay costs ~$floor s of $s s"
    echo "  (local disk: $(col local "$what" 5) s; the mount, indexing 128 pickles through the slow layer:"
    echo "  $(col slow "$what" 4) s against $(col local "$what" 4) s, not in the read's time)."
  done
  echo "- ckptfs overlaps the delay where the cat cannot: the kernel sends it several read requests of the view"
  echo "  at once (read_ahead_kb 1024 on its mount), its server threads serve them in parallel, each reading"
  echo "  the sources itself, so several source requests wait in the slow layer at the same time (mean"
  echo "  in flight $(col slow "ckptfs prefetch=0" 14) with prefetch off, against the cat's $(col slow "cat of the shards" 14)); the most in flight,"
  echo "  $(col slow "ckptfs prefetch=0" 13), is the slow layer's own limit: passthrough_ll runs libfuse's default of at most 10 worker"
  echo "  threads. The cat is one sequential reader of one file at a time, and pays most of the delay in series."
  pf0=$(col slow "ckptfs prefetch=0" 8) pf32=$(col slow "ckptfs prefetch=32" 8) pf128=$(col slow "ckptfs prefetch=128" 8)
  best=$(printf '%s\n' "$pf32" "$pf128" | sort -g | tail -n1)
  if awk -v b="$best" -v z="$pf0" 'BEGIN { exit !(b > 1.1 * z) }'; then
    echo "- **Prefetch** helps here: $pf32 (32) and $pf128 (128) GB/s against $pf0 GB/s without (medians)."
  else
    echo "- **Prefetch** does not help here: $pf32 (32) and $pf128 (128) GB/s against $pf0 GB/s without (medians;"
    echo "  each rep's seconds are in the table), while on the local disk prefetch=32 gives"
    echo "  $(col local "ckptfs prefetch=32" 8) GB/s against $(col local "ckptfs prefetch=0" 8) without."
  fi
  echo "  One \`posix_fadvise(WILLNEED)\` of 32 MiB on a shard through the slow mount made the slow layer read"
  echo "  **$probe_reads request(s), $probe_kib KiB**: the kernel bounds one WILLNEED call at the file's readahead size"
  echo "  (max of read_ahead_kb and the bdi's io_pages, \`force_page_cache_ra\` in mm/readahead.c), $slow_ra KiB on"
  echo "  this FUSE mount (recent kernels give NFS mounts 128 KiB by default too; the local disk's is $local_ra KiB)."
  echo "  ckptfs therefore advises each source range in calls of at most its device's read_ahead_kb"
  echo "  (\`io::File::prefetch\`): during the prefetch=32 read it made $(col slow "ckptfs prefetch=32" 15) WILLNEED calls for"
  echo "  $(col slow "ckptfs prefetch=32" 16) MiB, $(col slow "ckptfs prefetch=32" 17) MiB of it past the first $slow_ra KiB of its call (counted by the"
  echo "  shim, which forwards each call unchanged). The prefetch also splits the same bytes"
  echo "  into more, smaller source requests ($(col slow "ckptfs prefetch=32" 10) of $(col slow "ckptfs prefetch=32" 12) KiB against $(col slow "ckptfs prefetch=0" 10) of $(col slow "ckptfs prefetch=0" 12) KiB without), and each request pays the delay"
  echo "  whatever its size."
  echo "- On the local disk, prefetch off fetched $(col local "ckptfs prefetch=0" 7) bytes for the view against"
  echo "  $(col local "ckptfs prefetch=32" 7) with prefetch=32 (the slow layer, with its $slow_ra KiB readahead, served"
  echo "  $(col slow "ckptfs prefetch=0" 7)): the difference is the disk's own readahead ($local_ra KiB) running past the"
  echo "  ranges the view needs when nothing advises it."
}

if [ "$doc" != - ]; then
  slow_cat_gbs=$(col slow "cat of the shards" 8)
  local_cat_gbs=$(col local "cat of the shards" 8)
  best_ratio=$(for pf in 0 32 128; do col slow "ckptfs prefetch=$pf" 9; done | sort -g | tail -n1)
  worst_ratio=$(for pf in 0 32 128; do col slow "ckptfs prefetch=$pf" 9; done | sort -g | head -n1)
  {
    echo "# Cold reads with the sources on slow storage (added latency per read request)"
    echo
    echo '```'
    echo "$command_line    # root: FUSE mounts, drop_caches; ~$(awk -v s="$total_s" 'BEGIN { printf "%.0f", s / 60 + 0.5 }') min on $(nproc) CPUs"
    echo '```'
    echo
    echo "A stand-in for network storage (Lustre, NFS): libfuse's passthrough_ll example, copied and patched at"
    echo "bench time so that every read request it receives waits **${delay_us} us** (nanosleep) before it is served"
    echo "(multithreaded, at most 10 workers; \`-o source=DIR,ro,cache=auto\`: page cache and kernel readahead on, as"
    echo "an NFS client has them; read_ahead_kb $slow_ra of the slow mount, the kernel's default for FUSE). ckptfs is"
    echo "mounted on top of it (\`ckptfs SLOWMNT/checkpoint MNT -o prefetch=N,index_cache=off\`) and"
    echo "\`cat $view > /dev/null\` is timed; the baseline is one \`cat\` of every shard file through the same slow"
    echo "mount, in sorted order, in the same run. The same two reads with the sources on the local disk show what"
    echo "the latency costs. Every pass: fresh mounts, \`sync; echo 3 > /proc/sys/vm/drop_caches\` before mounting"
    echo "and again right before the timed read (the slow mount's page cache and the disk's: every byte pays the"
    echo "delay). Numbers are reported, never asserted; the issue's target: the view's rate >= 0.5x the slow cat's."
    echo
    echo "Which bytes each rate counts: **cat** rows, the shard files' bytes ($shard_bytes B, all 128 files);"
    echo "**ckptfs** rows, the view's bytes ($(col slow "ckptfs prefetch=32" 6) B, what \`cat\` got). The view is"
    echo "made from the fp32 masters only, about 1/3 of the optimizer-state files ($optim_bytes B: masters and two"
    echo "Adam moments). \"bytes fetched from the sources\" (not in any rate): on the slow layer, the bytes of the read"
    echo "requests it served during the read (its own count: what crossed the \"network\", the kernel's readahead"
    echo "included); on the local disk, the shard files' bytes in the page cache right after the read (\`fincore\`;"
    echo "dropped just before it, so: what the disk delivered, its readahead included). The view holds the tied"
    echo "head.weight (an alias of embed.weight in this checkpoint, 132 MB) twice and fetches it once, hence fewer"
    echo "bytes fetched than served. A ratio of 1.0 means the view is delivered at the rate the cat reads shard"
    echo "files."
    echo
    echo "ckptfs: \`${bin#"$PWD/"}\` built $bin_facts; the working tree at the start: $tree_facts."
    echo
    echo "Checkpoint: \`bench_z3_dp64\` (\`/usr/bin/python3 mount_tests/gen/generate.py WORKDIR/fixtures --only"
    echo "bench_z3_dp64\`): DeepSpeed ZeRO-3 bf16, 64 ranks, ${#shard_names[@]} shard files, $shard_bytes B."
    echo
    echo "Machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r),"
    echo "sources on $local_dev (virtual disk, read_ahead_kb $local_ra); load average $load_start at the start,"
    echo "$(cut -d' ' -f1-3 /proc/loadavg) at the end. Run $date_start, $reps rep(s), $total_s s in all."
    if awk -v l="${load_start%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
      echo "**Not quiet**: the load average at the start was over half the CPUs (other work on the machine), so"
      echo "the rates move between runs; the ratios within a run are the comparable figures."
    fi
    echo
    echo "## Results (medians over the reps, the ratio's too; read seconds of each rep)"
    echo
    echo "$summary"
    echo
    echo "Slow cat: $slow_cat_gbs GB/s; local cat: $local_cat_gbs GB/s. ckptfs's ratio on the slow layer (medians,"
    echo "prefetch 0, 32, 128): **$worst_ratio to $best_ratio** (target >= 0.5). \"slow-layer requests\": the read requests the slow layer received during"
    echo "the timed read (a snapshot of its counters before and after) and their mean size; \"most in flight\": the"
    echo "largest number of requests inside the slow layer at once over the mount's life; \"mean in flight\": the"
    echo "requests' summed time inside the slow layer (delay + serving) divided by the read's seconds. The ckptfs"
    echo "daemons run under a small LD_PRELOAD shim around \`posix_fadvise\` (built into WORKDIR at bench time) that"
    echo "counts the WILLNEED calls and forwards each unchanged; \"MiB past the bound\": the advised bytes beyond the"
    echo "first read_ahead_kb of the source mount in each call (what the kernel does not fetch ahead)."
    echo
    echo "## Where the time goes"
    echo
    where_the_time_goes
    echo
    echo "Every pass, every rep:"
    echo
    echo '```'
    # shellcheck disable=SC2059
    printf "$fmt" "${header[@]}"
    while IFS='|' read -r -a f; do
      # shellcheck disable=SC2059
      printf "$fmt" "${f[@]}"
    done <"$results"
    echo '```'
  } >"$doc.tmp"
  mv "$doc.tmp" "$doc"
  echo "report: $doc"
fi
