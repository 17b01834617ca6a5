#!/usr/bin/env bash
# Benchmark (not a test): read throughput of a ckptfs mount of a generated ZeRO-3 checkpoint of 64
# data-parallel ranks (~1.08 GB of fp32 master weights, 3.2 GB of optimizer shards), against baselines
# measured in the same run: `cat` of the source shards from the page cache, and the same shards read
# through libfuse's own passthrough_ll example (built here from /usr/share/doc/libfuse3-dev/examples).
#
#   bash bench/mount_bench.sh [WORKDIR]        (default WORKDIR: build/bench; needs root for FUSE mounts
#                                              and for the bdi readahead knob; CKPTFS_BIN overrides the
#                                              binary, default build/ckptfs)
#
# Prints, in GB/s (1e9 bytes/s; for model.safetensors, bytes of the bf16 file served):
#   - cat of the 64 optimizer shards to /dev/null (warm page cache, best of 3);
#   - passthrough_ll (-o cache=always, i.e. keep_cache like ckptfs): the same shards read through a fresh
#     passthrough mount (source warm, FUSE page cache cold), 1 reader (one cat of all shards) and
#     4 readers (4 parallel cats of 16 shards each), with the kernel's default readahead (128 KiB, the
#     example as shipped) and with the mount's bdi read_ahead_kb raised to 1024 (what ckptfs sets by
#     default: 1 MiB FUSE reads), so that both sides get the same request size; then a re-read of the
#     shards from its page cache (best of 3);
#   - ckptfs, for fp32/model.safetensors (fp32 partitions copied, no conversion) and model.safetensors
#     (fp32 -> bf16): first read through a freshly mounted ckptfs with 1 reader (cat; best of 3 fresh
#     mounts, each time logged); first read with
#     4 readers (fresh mount again; 4 parallel dd bs=1M, each reading one quarter of the file with
#     skip_bytes/count_bytes); a re-read (cat, served by the kernel page cache, best of 3); and what any
#     first read through a mount pays that cat does not, the view's bytes written into newly allocated
#     memory (dd from /dev/zero into a new /dev/shm file, best of 3);
#   - ratios: ckptfs first read / passthrough_ll first read (same reader count; both readahead settings),
#     re-read / cat, re-read / passthrough_ll re-read;
#   - ckptfs fp32/model.safetensors first read with -o read_ahead_kb=0 (128 KiB requests, like
#     passthrough_ll as shipped) and its ratio to passthrough_ll at that readahead;
#   - peak RSS (VmHWM) of a foreground (-f) ckptfs daemon after streaming all three merged views of this
#     checkpoint (~3 GB), and of a small one (z3_bf16_dp8, generated into WORKDIR) for comparison, with
#     the RSS right after mounting and the daemon's thread count: RSS must not grow with model size (it
#     is bounded by threads x per-thread buffers).
# Every mount is made under WORKDIR/mnt and unmounted on exit, error or signal; a mount left there by a
# killed earlier run is unmounted first. Takes ~25 s (plus ~16 s to generate the fixture the first
# time). Run it twice: the machine is shared and single runs are noisy.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, readahead, rate, timed_cat, ...
since_decimals=4  # mount times are sub-millisecond
work=$(realpath -m "${1:-build/bench}")
bin=$(realpath "${CKPTFS_BIN:-build/ckptfs}")
read_timeout=300  # seconds allowed for any single read pass

[ -x "$bin" ] || { echo "no ckptfs binary at $bin (cmake --build build)" >&2; exit 1; }
mkdir -p "$work/mnt"

# ---- cleanup: every mount made here is unmounted, every daemon started here is stopped ---------------
pt_mnt="$work/mnt/passthrough"
ck_mnt="$work/mnt/ckptfs"
mounts=("$pt_mnt" "$ck_mnt")
pids=()
cleanup() {
  local m p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done  # readers, then daemons, all started here
  for m in "${mounts[@]}"; do unmount "$m"; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { echo "$EPOCHREALTIME"; }

# 4 parallel readers, each dd-ing one quarter of file $1 (bs=1M, byte skip/count); prints seconds.
quarters() {
  local file=$1 size q i t0 rc=0
  local -a ps=()
  size=$(size_of "$file")
  q=$(((size + 3) / 4))
  t0=$EPOCHREALTIME
  for i in 0 1 2 3; do
    timeout "$read_timeout" dd if="$file" of=/dev/null bs=1M iflag=skip_bytes,count_bytes \
      skip=$((i * q)) count=$q status=none &
    ps+=($!)
  done
  for i in "${ps[@]}"; do wait "$i" || rc=$?; done
  [ "$rc" -eq 0 ] || { echo "a reader of $file failed ($rc)" >&2; return 1; }
  since "$t0"
}

# ---- workload ----------------------------------------------------------------------------------------
if ! gen_log=$(/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 z3_bf16_dp8 2>&1)
then
  echo "$gen_log" >&2
  exit 1
fi
src="$work/fixtures/bench_z3_dp64/checkpoint"
small="$work/fixtures/z3_bf16_dp8/checkpoint"
tag=$(basename "$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -n1)")
shard_names=()
for f in "$src/$tag"/*_optim_states.pt; do shard_names+=("$(basename "$f")"); done
shards=("${shard_names[@]/#/$src/$tag/}")
shard_bytes=$(cat "${shards[@]}" | wc -c)  # also warms the page cache for everything below

# ---- passthrough_ll, built from the example libfuse ships ---------------------------------------------
pt_bin="$work/passthrough_ll/passthrough_ll"
build_passthrough_ll "$pt_bin"

echo "source: $src"
echo "  64 optimizer shards, $shard_bytes bytes; fp32 master weights $(
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["fp32_master_bytes"])' \
    "$work/fixtures/bench_z3_dp64/case.json") bytes"
echo "  $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r)"
echo

t=$(best_cat "${shards[@]}")
cat_rate=$(rate "$shard_bytes" "$t")
record shard_bytes "$shard_bytes" "the 64 optimizer shards"
record cat_shards_s "$t" "cat of the optimizer shards, page cache, best of 3"
echo "baseline cat shards > /dev/null (page cache, best of 3): $cat_rate GB/s"

# passthrough_ll: fresh mount per pass, so its own page cache is cold and only the source is warm.
pt_pass() {  # $1: readahead KiB (0: leave the kernel's default), $2: readers (1 or 4); sets pt_rate, pt_ra
  local ra=$1 readers=$2 t0 t i rc=0 pid
  local -a ps=() files
  fresh_dir "$pt_mnt"
  timeout 60 "$pt_bin" -o "source=$src,ro,cache=always" "$pt_mnt"
  wait_mounted "$pt_mnt"
  if [ "$ra" -ne 0 ]; then
    pt_ra=$(set_readahead "$pt_mnt" "$ra")
  else
    pt_ra=$(cat "/sys/class/bdi/$(bdi_of "$pt_mnt")/read_ahead_kb")
  fi
  files=("${shard_names[@]/#/$pt_mnt/$tag/}")
  t0=$(now)
  if [ "$readers" -eq 1 ]; then
    timeout "$read_timeout" cat "${files[@]}" >/dev/null
  else
    for i in 0 1 2 3; do
      timeout "$read_timeout" cat "${files[@]:$((i * 16)):16}" >/dev/null &
      ps+=($!)
      pids+=($!)
    done
    for pid in "${ps[@]}"; do wait "$pid" || rc=$?; done
    pids=()  # all reaped: nothing of ours left to kill
    [ "$rc" -eq 0 ] || { echo "passthrough reader failed ($rc)" >&2; return 1; }
  fi
  t=$(since "$t0")
  pt_rate=$(rate "$shard_bytes" "$t")
  if [ "$readers" -eq 1 ]; then  # the kernel page cache of the FUSE mount, for the re-read comparison
    t=$(best_cat "${files[@]}")
    pt_reread=$(rate "$shard_bytes" "$t")
  fi
  unmount "$pt_mnt"
}
declare -A pt
for ra in 0 1024; do
  for readers in 1 4; do
    pt_pass "$ra" "$readers"
    pt[$ra,$readers]=$pt_rate
    record "passthrough_ll.ra$ra.readers$readers.first_gbs" "$pt_rate" "read_ahead_kb=$pt_ra (0: the default)"
    echo "baseline passthrough_ll, read_ahead_kb=$pt_ra, $readers reader(s), first read: $pt_rate GB/s"
  done
done
echo "baseline passthrough_ll re-read (its page cache, best of 3): $pt_reread GB/s"
record passthrough_ll.reread_gbs "$pt_reread"
echo

# What a first read through a mount pays and cat of the shards does not: the kernel puts what it reads into
# newly allocated page cache of the mount, where cat reuses one buffer. On a VM whose host backs guest memory
# lazily (free page reporting), first touch of new memory can cost more than the copy. Baseline: as many
# bytes written into newly allocated memory, a new tmpfs file (which also zeroes each page: an upper estimate).
fill_new_memory() {  # $1: bytes, $2: a file on tmpfs, replaced; prints seconds
  local t0
  rm -f "$2"
  t0=$(now)
  dd if=/dev/zero of="$2" bs=1M count="$1" iflag=count_bytes status=none
  since "$t0"
}

# ---- ckptfs -------------------------------------------------------------------------------------------
ck_mount() {  # fresh background mount (page cache of the view empty); args: extra ckptfs options
  fresh_dir "$ck_mnt"
  timeout 60 "$bin" "$src" "$ck_mnt" "$@"
  wait_mounted "$ck_mnt"
}
for view in fp32/model.safetensors model.safetensors; do
  # First read: the best of 3 fresh mounts, like the cat it is compared with. A first read fills the
  # mount's page cache with newly allocated memory, and on a VM with free page reporting (virtio-balloon)
  # that memory may first have to be faulted in by the host: single runs here spread over 0.4-2.3 s.
  firsts=()
  for pass in 1 2 3; do
    ck_mount
    file="$ck_mnt/$view"
    firsts+=("$(timed_cat "$file")")
    if [ "$pass" = 1 ]; then
      bytes=$(size_of "$file")
      ra=$(cat "/sys/class/bdi/$(bdi_of "$ck_mnt")/read_ahead_kb")
      t=$(best_cat "$file")
      again=$(rate "$bytes" "$t")
      record "ckptfs.$view.reread_s" "$t"
    fi
    unmount "$ck_mnt"
  done
  t=$(printf '%s\n' "${firsts[@]}" | sort -g | head -1)
  one=$(rate "$bytes" "$t")
  record "ckptfs.$view.bytes" "$bytes"
  record "ckptfs.$view.first1_s" "$t" "read_ahead_kb=$ra; best of 3 fresh mounts: ${firsts[*]} s"
  fill_file=$(mktemp -p /dev/shm ckptfs-fill.XXXXXX)
  fill=$(fastest_of_3 fill_new_memory "$bytes" "$fill_file")
  rm -f "$fill_file"
  record "fresh_memory.$view.fill_s" "$fill" "dd of the view's bytes into a new /dev/shm file, best of 3"
  ck_mount
  t=$(quarters "$file")
  four=$(rate "$bytes" "$t")
  record "ckptfs.$view.first4_s" "$t"
  unmount "$ck_mnt"
  echo "ckptfs $view ($bytes bytes, read_ahead_kb=$ra):"
  echo "  first read, 1 reader (cat, best of 3 mounts):  $one GB/s (${firsts[*]} s)"
  echo "  baseline: the view's bytes written into new memory (tmpfs, best of 3): $(rate "$bytes" "$fill") GB/s"
  echo "  first read, 4 readers (dd, one quarter each):  $four GB/s"
  echo "  re-read (page cache, cat, best of 3):          $again GB/s"
  echo "  ratio first read / passthrough_ll, 1 reader:   $(ratio "$one" "${pt[1024,1]}") (both 1024 KiB" \
    "readahead), $(ratio "$one" "${pt[0,1]}") (passthrough_ll at the default 128)"
  echo "  ratio first read / passthrough_ll, 4 readers:  $(ratio "$four" "${pt[1024,4]}") (both 1024 KiB" \
    "readahead), $(ratio "$four" "${pt[0,4]}") (passthrough_ll at the default 128)"
  echo "  ratio re-read / cat: $(ratio "$again" "$cat_rate")   re-read / passthrough_ll re-read:" \
    "$(ratio "$again" "$pt_reread")"
done
# The same request size as passthrough_ll as shipped: 128 KiB readahead, so 128 KiB FUSE reads.
ck_mount -o read_ahead_kb=0
file="$ck_mnt/fp32/model.safetensors"
bytes=$(size_of "$file")
ra=$(cat "/sys/class/bdi/$(bdi_of "$ck_mnt")/read_ahead_kb")
t=$(timed_cat "$file")
small_ra=$(rate "$bytes" "$t")
record "ckptfs.fp32/model.safetensors.ra0.first1_s" "$t" "read_ahead_kb=$ra"
unmount "$ck_mnt"
echo "ckptfs fp32/model.safetensors, -o read_ahead_kb=0 (read_ahead_kb=$ra), first read, 1 reader:" \
  "$small_ra GB/s; ratio / passthrough_ll at the same readahead: $(ratio "$small_ra" "${pt[0,1]}")"
echo

# ---- peak RSS of the daemon while streaming every merged view ---------------------------------------
rss_case() {  # $1: label, $2: checkpoint dir
  local label=$1 dir=$2 pid streamed=0 f hwm_mounted hwm threads
  fresh_dir "$ck_mnt"
  "$bin" "$dir" "$ck_mnt" -f 2>"$work/ckptfs-rss.log" &
  pid=$!
  pids+=("$pid")
  wait_mounted "$ck_mnt"
  ls "$ck_mnt" >/dev/null
  hwm_mounted=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status")
  for f in fp32/model.safetensors fp32/pytorch_model.bin model.safetensors; do
    timeout "$read_timeout" cat "$ck_mnt/$f" >/dev/null
    streamed=$((streamed + $(size_of "$ck_mnt/$f")))
  done
  hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$pid/status")
  threads=$(awk '/^Threads/ { print $2 }' "/proc/$pid/status")
  record "rss.${label%% *}.hwm_kib" "$hwm" "after streaming $streamed bytes"
  unmount "$ck_mnt"
  wait "$pid" || true
  pids=()
  echo "peak RSS $label: $((hwm / 1024)) MiB after streaming $streamed bytes (3 views;" \
    "$((hwm_mounted / 1024)) MiB once mounted; $threads threads)"
}
rss_case "bench_z3_dp64" "$src"
rss_case "z3_bf16_dp8  " "$small"
