#!/usr/bin/env bash
# Benchmark (not a test): what real loaders do on a ckptfs mount (issue 10, "loader traffic"), against the
# same files exported to local disk (`ckptfs export`), all in one run so the ratios compare like with like
# (same machine, same disk, same clients). Numbers are reported, never asserted.
#
#   bash bench/loader_bench.sh [WORKDIR] [SRC]   (default WORKDIR: build/bench; SRC: a checkpoint folder,
#                                                default the generated 64-rank ZeRO-3 bf16 one,
#                                                WORKDIR/fixtures/bench_z3_dp64/checkpoint: 128 shard files,
#                                                3.2 GB; needs root for FUSE mounts, drop_caches and chroot;
#                                                CKPTFS_BIN overrides the binary, default build/ckptfs)
#
# The clients are the Debian 13 chroot's (mount_tests/modern/setup_chroot.sh: torch 2.x and the reference
# safetensors library): CKPTFS_CHROOT, else build/trixie or /var/cache/ckptfs/trixie, whichever is set up.
# One client process (bench/loader_bench_client.py, torch imported once) takes a command per run; ckptfs
# runs on the host, its mount under CHROOT/tmp/ckptfs-loader-bench/mnt and the export in
# CHROOT/tmp/ckptfs-loader-bench/export (the same disk as SRC when both are on the root file system), so
# that the chroot sees both.
#
# Loaders (each also copies every tensor's bytes into a reused scratch buffer, timed: both libraries map the
# file lazily, see the client's docstring):
#   safe_open   safetensors.safe_open + get_tensor of every key, on model.safetensors and
#               fp32/model.safetensors, 1 thread and 4 (the keys handed out to a pool of 4, a handle each);
#   load_file   safetensors.torch.load_file, on the same two files, 1 thread (it has none to split over);
#   torch_load  torch.load(fp32/pytorch_model.bin, mmap=True, weights_only=True), 1 thread and 4 (the
#               tensors it returns copied by a pool of 4).
# Each on the mount and on the export, cold then warm:
#   cold  `sync; echo 3 > /proc/sys/vm/drop_caches` (the whole machine's page cache: the shards, the export)
#         and, for the mount, a fresh mount (default options); then a small untimed run of every loader on
#         files in the chroot's /tmp (pages the loaders' code back in); then the timed run;
#   warm  the same run again right after, on the same mount (page caches as the cold run left them): the
#         best of 2.
# Prints, per loader, file and thread count: GB/s (tensor bytes / seconds of the call plus the copies) on
# the mount and on the export, and the ratio mount / export (export seconds / mount seconds), cold and
# warm; the tensor count and bytes of both sides are checked to be equal; the seconds of every run go to
# WORKDIR/loader-bench.log. Takes ~60 s on 2 CPUs with bench_z3_dp64 (the export's 12 s included; plus
# the checkpoint's generation the first time). Results: docs/loader-bench.md.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, rate, ratio, stop_and_unmount, ...
bench_setup "${1:-}"  # $work, $bin, $read_timeout, $t_start
[ -w /proc/sys/vm/drop_caches ] || { echo "needs a writable /proc/sys/vm/drop_caches (root)" >&2; exit 1; }
if [ -n "${2:-}" ]; then
  src=$(realpath "$2")
else
  /usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 >/dev/null
  src="$work/fixtures/bench_z3_dp64/checkpoint"
fi
find_chroot  # $chroot_dir: the Debian 13 chroot with torch 2.x
inside=/tmp/ckptfs-loader-bench  # the bench's folder as the chroot sees it
cwork=$chroot_dir$inside         # ... and as the host sees it
mnt=$cwork/mnt
export_dir=$cwork/export
mkdir -p "$work" "$cwork/scratch"
log=$work/loader-bench.log
: >"$log"

mounts=("$mnt")
pids=()
client_pid=
cleanup() {
  if [ -n "$client_pid" ]; then
    { echo quit >&"${client[1]}"; } 2>/dev/null || true
    kill "$client_pid" 2>/dev/null || true
    wait "$client_pid" 2>/dev/null || true
  fi
  stop_and_unmount
  rm -rf "$export_dir" "$cwork/scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mount_fresh() {
  fresh_dir "$mnt"
  "$bin" "$src" "$mnt" 2>>"$log"
  wait_mounted "$mnt"
}

# ---- the export: every view, to local disk (not timed here: bench/export_bench.sh times it) ------------
avail=$(df --output=avail -B1 "$cwork" | tail -n1)
need=$(du -sb "$src" | cut -f1)  # the views are at most the shards' size
[ "$avail" -gt $((need + 2000000000)) ] || { echo "$(gb "$avail") free under $cwork; ~$(gb "$need") needed" >&2; exit 1; }
rm -rf "$export_dir"
t0=$EPOCHREALTIME
"$bin" export "$src" "$export_dir" 2>>"$log"
export_s=$(since "$t0")
sync

# ---- the client: one chroot python for the whole run, a command a line --------------------------------
cp bench/loader_bench_client.py "$cwork/loader_bench_client.py"
coproc client {
  exec chroot "$chroot_dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
    python3 -u "$inside/loader_bench_client.py" "$inside/scratch" 2>>"$log"
}
# shellcheck disable=SC2154  # client_PID: set by coproc
client_pid=$client_PID
# (no subshells around these: a coprocess's file descriptors are the shell's own)
reply() {  # sets answer to the client's next RESULT/READY line (others: torch's complaints about /proc)
  local line
  while IFS= read -r -t "$read_timeout" line <&"${client[0]}"; do
    case $line in
      RESULT* | READY*) answer=${line#* }; return 0 ;;
      ERROR*) echo "client: $line (log: $log)" >&2; return 1 ;;
      *) echo "$line" >>"$log" ;;
    esac
  done
  echo "the client stopped or timed out (log: $log)" >&2
  tail -n 20 "$log" >&2
  return 1
}
ask() { echo "$*" >&"${client[1]}"; reply; }  # sets answer
json() { /usr/bin/python3 -c 'import json,sys; d = json.load(sys.stdin); print(*(d[k] for k in sys.argv[1:]))' "$@"; }
reply
versions=$answer

mapfile -t shards < <(find "$src" -type f | sort)
shard_bytes=$(du -cb "${shards[@]}" | tail -1 | cut -f1)
echo "checkpoint: $src, ${#shards[@]} files, $shard_bytes bytes ($(gb "$shard_bytes"))"
for v in model.safetensors fp32/model.safetensors fp32/pytorch_model.bin; do
  echo "  $v: $(size_of "$export_dir/$v") bytes"
done
echo "clients (chroot $chroot_dir): $versions; export to $export_dir: ${export_s} s (untimed setup)"
echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r); $(date -u '+%F %T UTC')"
echo

# one measurement pair: cold (fresh caches, fresh mount) and warm (best of 2 right after); sets cold_s,
# warm_s (seconds) and got ("tensors bytes", for the check that both sides read the same)
measure() {  # $1: mount|export, $2: loader, $3: view, $4: threads
  local where=$1 loader=$2 view=$3 threads=$4 root s bytes tensors best=
  drop
  if [ "$where" = mount ]; then mount_fresh; root=$inside/mnt; else root=$inside/export; fi
  ask prime
  ask run "$loader" "$root/$view" "$threads"
  read -r s bytes tensors < <(json s bytes tensors <<<"$answer")
  cold_s=$s
  got="$tensors $bytes"
  for _ in 1 2; do
    ask run "$loader" "$root/$view" "$threads"
    read -r s bytes tensors < <(json s bytes tensors <<<"$answer")
    if [ -z "$best" ] || awk -v t="$s" -v b="$best" 'BEGIN { exit !(t < b) }'; then best=$s; fi
  done
  warm_s=$best
  echo "$where $loader $view $threads: $got (tensors bytes), cold $cold_s s, warm $warm_s s" >>"$log"
  [ "$where" = export ] || unmount "$mnt"
}

fmt='%-10s %-24s %3s %8s %11s | %7s %7s %6s | %7s %7s %6s\n'
# shellcheck disable=SC2059  # the format is the variable
printf "$fmt" loader file thr tensors bytes "cold GB/s: mount" export ratio "warm: mount" export ratio
rows=(
  "safe_open model.safetensors 1" "safe_open model.safetensors 4" "load_file model.safetensors 1"
  "safe_open fp32/model.safetensors 1" "safe_open fp32/model.safetensors 4"
  "load_file fp32/model.safetensors 1"
  "torch_load fp32/pytorch_model.bin 1" "torch_load fp32/pytorch_model.bin 4"
)
for row in "${rows[@]}"; do
  read -r loader view threads <<<"$row"
  measure export "$loader" "$view" "$threads"
  e_cold=$cold_s e_warm=$warm_s e_got=$got
  measure mount "$loader" "$view" "$threads"
  [ "$got" = "$e_got" ] || { echo "$loader $view: mount read $got (tensors bytes), export $e_got" >&2; exit 1; }
  bytes=${got#* }
  record "$loader.$view.threads$threads.bytes" "$bytes"
  record "$loader.$view.threads$threads.mount_cold_s" "$cold_s"
  record "$loader.$view.threads$threads.export_cold_s" "$e_cold"
  record "$loader.$view.threads$threads.mount_warm_s" "$warm_s" "best of 2"
  record "$loader.$view.threads$threads.export_warm_s" "$e_warm" "best of 2"
  # shellcheck disable=SC2059,SC2086  # the format is the variable; $got is two fields
  printf "$fmt" "$loader" "$view" "$threads" $got "$(rate "$bytes" "$cold_s")" "$(rate "$bytes" "$e_cold")" \
    "$(ratio "$e_cold" "$cold_s")" "$(rate "$bytes" "$warm_s")" "$(rate "$bytes" "$e_warm")" \
    "$(ratio "$e_warm" "$warm_s")"
done
echo
echo "total run time: $(since "$t_start") s"
