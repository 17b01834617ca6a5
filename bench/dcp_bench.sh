#!/usr/bin/env bash
# Benchmark (not a test): ckptfs on a PyTorch Distributed Checkpoint (DCP) of 2 GiB of tensor data (4 ranks;
# DTensor Shard(0), Shard(1) and (Shard(0), Shard(1)) on a 2x2 mesh; fp32 and bf16; model and optimizer
# state), against PyTorch's own converter and the passthrough FUSE floor, all in one run so the ratios
# compare like with like (same machine, same page cache). Numbers are reported, never asserted.
#
#   bash bench/dcp_bench.sh [WORKDIR]        (default WORKDIR: build/bench; needs root for FUSE mounts, the
#                                            bdi readahead knob and chroot; CKPTFS_BIN overrides the binary,
#                                            default build/ckptfs)
#
# torch.distributed.checkpoint needs torch 2.x, which only the Debian 13 chroot of
# mount_tests/modern/setup_chroot.sh has: CKPTFS_CHROOT, else build/trixie or /var/cache/ckptfs/trixie,
# whichever is set up. The checkpoint is generated there (bench/dcp_bench_checkpoint.py, gloo on CPU, ~30 s)
# into CHROOT/tmp/ckptfs-dcp-bench/ckpt and reused while CHROOT/tmp/ckptfs-dcp-bench/ckpt.complete
# names the script's SPEC_VERSION; ckptfs (on the host) reads the same files by their host path.
#
# Prints:
#   - cat of the 4 .distcp files to /dev/null (warm page cache, best of 3), GB/s;
#   - passthrough_ll (libfuse's example, built into WORKDIR/passthrough_ll as bench/mount_bench.sh does,
#     -o cache=always): first read of the .distcp files through a fresh mount, 1 reader, with the mount's
#     read_ahead_kb at 1024 (what ckptfs sets) and at the kernel default (128);
#   - dcp_to_torch_save(ckpt, out.pt) in the chroot: the call's seconds, the process's (torch import
#     included), its peak RSS (ru_maxrss), out.pt's size; then (not timed) a check in the chroot that a
#     ckptfs mount's full_state.pt equals out.pt (every value) and model.safetensors its 'model' subtree;
#   - `ckptfs export CKPT OUT` (every view: full_state.pt, model.safetensors, fp32/...; 2.75x out.pt's
#     bytes) next to out.pt and into /dev/shm: seconds, bytes written, peak RSS (GNU time), ratios to
#     dcp_to_torch_save;
#   - `cp MNT/full_state.pt` from a fresh ckptfs mount (the same file as out.pt): seconds, ratio to
#     dcp_to_torch_save, and the daemon's peak RSS;
#   - first read (cat > /dev/null, fresh mount each) of model.safetensors, full_state.pt and
#     fp32/model.safetensors, GB/s, ratios to passthrough_ll's first read and to cat; the daemon's VmHWM after
#     each; then the first read of each large tensor of model.safetensors alone (dd of its byte range,
#     one fresh mount, tensors in file order), labelled with its dtype and placement, to show whether
#     Shard(1) and 2-D chunks (rows gathered from 4 or 2 chunks) cost more than Shard(0) ones.
# Outputs (out.pt, the export) are written next to the checkpoint (same file system for both), deleted
# right after measuring: peak disk use ~8 GB (checkpoint 2.15 GB + export 5.9 GB). Every mount is made under
# WORKDIR/mnt (the check's under CHROOT/tmp/ckptfs-dcp-bench/mnt) and unmounted on exit, error or signal.
# Takes ~75 s on 2 CPUs (plus ~30 s to generate the checkpoint the first time). Run it twice: single runs
# on a shared machine are noisy (the per-tensor lines read 128-256 MiB each, the noisiest).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
repo=$PWD
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, readahead, rate, timed_cat, ...
bench_setup "${1:-}"  # $work, $bin, $read_timeout, $t_start
find_chroot  # $chroot_dir: the Debian 13 chroot with torch 2.x
inside=/tmp/ckptfs-dcp-bench   # the bench's folder as the chroot sees it
cwork=$chroot_dir$inside       # ... and as the host sees it
ckpt=$cwork/ckpt
out_pt=$cwork/out.pt
export_dir=$cwork/export
copy_pt=$cwork/full_state_copy.pt
shm_dir=/dev/shm/ckptfs-dcp-bench.$$
mkdir -p "$work/mnt" "$cwork"
: >"$work/dcp-ckptfs.log"

# ---- cleanup: every mount made here is unmounted, every daemon started here stopped, outputs removed --
pt_mnt="$work/mnt/dcp-passthrough"
ck_mnt="$work/mnt/dcp-ckptfs"
check_mnt="$cwork/mnt"
mounts=("$pt_mnt" "$ck_mnt" "$check_mnt")
pids=()
cleanup() {
  stop_and_unmount
  rm -rf "$out_pt" "$export_dir" "$copy_pt" "$ckpt.tmp" "$shm_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# chroot python, its stderr (torch's warnings about the missing /proc, gloo's hostname notice) kept in a log
# that is shown only when the command fails
in_chroot() {  # $1: log file, then the command
  local log=$1
  shift
  if ! chroot "$chroot_dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@" 2>"$log"; then
    grep -v 'UCX  ERROR\|Error in cpuinfo' "$log" | tail -n 30 >&2
    echo "failed in the chroot: $* (log: $log)" >&2
    return 1
  fi
}

# ckptfs in the foreground (so that its VmHWM can be read), in the background of this shell; sets ck_pid
ck_mount() {  # $1: mount point, then extra ckptfs options
  local m=$1
  shift
  fresh_dir "$m"
  "$bin" "$ckpt" "$m" -f "$@" 2>>"$work/dcp-ckptfs.log" &
  ck_pid=$!
  pids+=("$ck_pid")
  wait_mounted "$m"
}

# ---- workload: generated once in the chroot, reused while its stamp names the script's spec ------------
cp bench/dcp_bench_checkpoint.py "$cwork/dcp_bench_checkpoint.py"
spec=$(sed -n 's/^SPEC_VERSION = "\([^"]*\)".*/\1/p' bench/dcp_bench_checkpoint.py)
if [ "$(cat "$ckpt.complete" 2>/dev/null)" != "$spec" ]; then
  avail=$(df --output=avail -B1 "$cwork" | tail -n1)
  [ "$avail" -gt 9000000000 ] || { echo "$(gb "$avail") free under $cwork; ~9 GB needed" >&2; exit 1; }
  echo "generating the checkpoint in the chroot (4 ranks, gloo on CPU) into $ckpt ..."
  t0=$EPOCHREALTIME
  in_chroot "$work/dcp-generate.log" env DCP_BENCH_PORT=$((20000 + RANDOM % 20000)) \
    python3 "$inside/dcp_bench_checkpoint.py" generate "$inside/ckpt" >/dev/null
  echo "  generated in $(since "$t0") s"
  sync  # no writeback of the fresh checkpoint during the timed runs
fi
distcp=("$ckpt"/*.distcp)
distcp_names=()
for f in "${distcp[@]}"; do distcp_names+=("$(basename "$f")"); done
distcp_bytes=$(cat "${distcp[@]}" | wc -c)  # also warms the page cache

echo "source: $ckpt"
echo "  ${#distcp[@]} .distcp files, $distcp_bytes bytes ($(gb "$distcp_bytes")); chroot $chroot_dir" \
  "($(grep -m1 '^torch ' "$chroot_dir/.ckptfs-chroot-complete"))"
echo "  $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r)," \
  "$(gb "$(df --output=avail -B1 "$cwork" | tail -n1)") free"
echo

t=$(best_cat "${distcp[@]}")
cat_rate=$(rate "$distcp_bytes" "$t")
record distcp_bytes "$distcp_bytes"
record cat_distcp_s "$t" "page cache, best of 3"
echo "baseline cat .distcp > /dev/null (page cache, best of 3):          $cat_rate GB/s"

# ---- passthrough_ll, built from the example libfuse ships (the same build as bench/mount_bench.sh) -------
pt_bin="$work/passthrough_ll/passthrough_ll"
build_passthrough_ll "$pt_bin"
declare -A pt
for ra in 1024 0; do  # fresh mount each: its page cache cold, the source warm
  fresh_dir "$pt_mnt"
  timeout 60 "$pt_bin" -o "source=$ckpt,ro,cache=always" "$pt_mnt"
  wait_mounted "$pt_mnt"
  if [ "$ra" -ne 0 ]; then ra_now=$(set_readahead "$pt_mnt" "$ra"); else ra_now=$(readahead_of "$pt_mnt"); fi
  t=$(timed_cat "${distcp_names[@]/#/$pt_mnt/}")
  pt[$ra]=$(rate "$distcp_bytes" "$t")
  record "passthrough_ll.ra$ra.first_s" "$t" "read_ahead_kb=$ra_now (0: the default)"
  unmount "$pt_mnt"
  echo "baseline passthrough_ll first read, read_ahead_kb=$ra_now, 1 reader:  ${pt[$ra]} GB/s"
done
echo

# ---- dcp_to_torch_save in the chroot -----------------------------------------------------------------
rm -f "$out_pt"
sync
t0=$EPOCHREALTIME
conv=$(in_chroot "$work/dcp-convert.log" python3 "$inside/dcp_bench_checkpoint.py" convert "$inside/ckpt" \
  "$inside/out.pt" | grep '^{')  # (torch's UCX prints a complaint about the missing /proc on stdout)
conv_proc_s=$(since "$t0")
conv_s=$(echo "$conv" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["convert_s"])')
conv_rss=$(echo "$conv" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["maxrss_kb"])')
out_bytes=$(size_of "$out_pt")
record dcp_to_torch_save_s "$conv_s" "the call; out.pt $out_bytes bytes"
record dcp_to_torch_save_process_s "$conv_proc_s" "python + torch import included"
record dcp_to_torch_save_rss_kib "$conv_rss"
record out_pt_bytes "$out_bytes"
echo "dcp_to_torch_save (chroot): ${conv_s} s (${conv_proc_s} s with python + torch import)," \
  "peak RSS $(mib "$conv_rss"), out.pt $out_bytes bytes ($(rate "$out_bytes" "$conv_s") GB/s written)"

# not timed: ckptfs's full_state.pt and model.safetensors against out.pt, in the chroot
ck_mount "$check_mnt"
check=$(in_chroot "$work/dcp-check.log" python3 "$inside/dcp_bench_checkpoint.py" check "$inside/out.pt" \
  "$inside/mnt" | tail -n1)
ck_unmount "$check_mnt"
rm -f "$out_pt"
echo "  check (chroot): $check"

# ---- ckptfs export: next to out.pt (disk), then into /dev/shm (the engine without the disk) ------------
# It writes every view (full_state.pt, model.safetensors, fp32/model.safetensors, fp32/pytorch_model.bin):
# ~2.75x out.pt's bytes, beyond the kernel's dirty-page limit on a 24 GiB machine, so on disk it waits for
# writeback where out.pt (2.15 GB) does not; the cp line below writes out.pt's bytes.
export_to() {  # $1: output dir, $2: label
  local out=$1 s rss bytes
  rm -rf "$out"
  cat "${distcp[@]}" >/dev/null  # the source stays warm whatever the converter evicted
  timed_export "$ckpt" "$out" dcp-export
  s=$export_s rss=$export_rss bytes=$export_bytes
  rm -rf "$out"
  record "export.$([[ $out == /dev/shm/* ]] && echo shm || echo disk).s" "$s" "$bytes bytes written; peak RSS $rss KiB"
  echo "ckptfs export (every view) $2: ${s} s, $bytes bytes written ($(rate "$bytes" "$s") GB/s)," \
    "peak RSS $(mib "$rss")"
  echo "  ratio time / dcp_to_torch_save: $(ratio "$s" "$conv_s") (call), $(ratio "$s" "$conv_proc_s") (process)" \
    "  RSS / dcp_to_torch_save: $(ratio "$rss" "$conv_rss")   GB/s written / dcp_to_torch_save's:" \
    "$(ratio "$(rate "$bytes" "$s")" "$(rate "$out_bytes" "$conv_s")")"
}
avail=$(df --output=avail -B1 "$cwork" | tail -n1)
[ "$avail" -gt 7000000000 ] || { echo "$(gb "$avail") free under $cwork; ~7 GB needed for the export" >&2; exit 1; }
export_to "$export_dir" "to disk (next to out.pt)"
if [ -d /dev/shm ] && [ "$(df --output=avail -B1 /dev/shm | tail -n1)" -gt 7000000000 ]; then
  export_to "$shm_dir" "to /dev/shm"
else
  echo "ckptfs export to /dev/shm: skipped (under 7 GB free there)"
fi

# the same output as out.pt: full_state.pt copied out of a fresh mount (mount time included)
rm -f "$copy_pt"
sync
t0=$EPOCHREALTIME
ck_mount "$ck_mnt"
timeout "$read_timeout" cp "$ck_mnt/full_state.pt" "$copy_pt"
copy_s=$(since "$t0")
ck_unmount "$ck_mnt"
copy_hwm=$ck_hwm
copy_bytes=$(size_of "$copy_pt")
record mount_cp_full_state_s "$copy_s" "$copy_bytes bytes; daemon peak RSS $copy_hwm KiB"
rm -f "$copy_pt"
echo "ckptfs mount + cp full_state.pt to a file: ${copy_s} s ($copy_bytes bytes), daemon peak RSS $(mib "$copy_hwm")"
echo "  ratio time / dcp_to_torch_save: $(ratio "$copy_s" "$conv_s") (call), $(ratio "$copy_s" "$conv_proc_s")" \
  "(process)   RSS / dcp_to_torch_save: $(ratio "$copy_hwm" "$conv_rss")"
echo

# ---- first reads through a fresh mount ---------------------------------------------------------------
hwm_max=0
for view in model.safetensors full_state.pt fp32/model.safetensors; do
  ck_mount "$ck_mnt"
  file="$ck_mnt/$view"
  bytes=$(size_of "$file")
  ra=$(readahead_of "$ck_mnt")
  t=$(timed_cat "$file")
  ck_unmount "$ck_mnt"
  hwm=$ck_hwm
  if [ "$hwm" -gt "$hwm_max" ]; then hwm_max=$hwm; fi
  r=$(rate "$bytes" "$t")
  record "ckptfs.$view.bytes" "$bytes"
  record "ckptfs.$view.first_s" "$t" "fresh mount, read_ahead_kb=$ra; daemon VmHWM $hwm KiB"
  printf 'ckptfs first read %-23s %11s bytes, read_ahead_kb=%s: %5s GB/s; / passthrough_ll %s (1024), %s (128);' \
    "$view" "$bytes" "$ra" "$r" "$(ratio "$r" "${pt[1024]}")" "$(ratio "$r" "${pt[0]}")"
  echo " / cat $(ratio "$r" "$cat_rate"); daemon VmHWM $(mib "$hwm")"
done
echo "ckptfs daemon peak RSS over these reads (VmHWM, a fresh daemon per view): $(mib "$hwm_max")"

# per tensor: each large tensor of model.safetensors read alone (its first read), one fresh mount
ck_mount "$ck_mnt"
ranges=$(/usr/bin/python3 - "$ck_mnt/model.safetensors" "$repo/bench" <<'EOF'
import json, struct, sys
sys.path.insert(0, sys.argv[2])
from dcp_bench_checkpoint import MODEL  # standard library only at import: fine on the host's python
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
rows = []
for name, e in header.items():
    a, b = e["data_offsets"] if name != "__metadata__" else (0, 0)
    if b - a >= 64 << 20:
        _, _, mesh, placements = MODEL[name]
        rows.append((8 + n + a, b - a, name, e["dtype"], f"{','.join(placements)} {mesh} mesh"))
for r in sorted(rows):
    print(*r, sep="\t")
EOF
)
while IFS=$'\t' read -r off len name dtype placement; do
  t0=$EPOCHREALTIME
  timeout "$read_timeout" dd if="$ck_mnt/model.safetensors" of=/dev/null bs=1M iflag=skip_bytes,count_bytes \
    skip="$off" count="$len" status=none
  r=$(rate "$len" "$(since "$t0")")
  printf '  model.safetensors %-26s %-4s %-15s %10s bytes: %5s GB/s (/ passthrough_ll 1024: %s)\n' \
    "$name" "$dtype" "$placement" "$len" "$r" "$(ratio "$r" "${pt[1024]}")"
done <<<"$ranges"
ck_unmount "$ck_mnt"
echo
echo "total run time: $(since "$t_start") s"
