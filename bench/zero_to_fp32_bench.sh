#!/usr/bin/env bash
# Benchmark (not a test): DeepSpeed's own converter, deepspeed/utils/zero_to_fp32.py, against ckptfs on the
# generated 64-rank ZeRO-3 bf16 checkpoint (bench_z3_dp64 of mount_tests/gen/generate.py, the one of
# bench/mount_bench.sh: 128 shard files, 3.24 GB, fp32 masters 1.08 GB), in one run, cold and warm, so the
# ratios compare like with like. Numbers are reported, never asserted.
#
#   DEEPSPEED_SRC=DIR bash bench/zero_to_fp32_bench.sh [WORKDIR]
#       DIR: a DeepSpeed checkout, or a bare git dir (its HEAD is read); WORKDIR: default build/bench.
#       Root: FUSE, drop_caches, chroot and a bind mount. CKPTFS_BIN overrides the binary (build/ckptfs).
#
# No DeepSpeed code is in this repository, and none is installed: at bench time the script copies
# deepspeed/utils/zero_to_fp32.py and deepspeed/checkpoint/constants.py out of DIR into
# WORKDIR/zero_to_fp32/ds/ and writes, next to them, our own few lines: the import shim the script needs
# (deepspeed/utils/__init__.py with a `logger`, deepspeed/checkpoint/__init__.py exposing the constants, and
# mount_tests/gen/deepspeed_classes.py's stand-ins for the DeepSpeed classes the checkpoint pickles name), a
# pass-through `tqdm` when the interpreter has none, and run_zero_to_fp32.py, which imports the script and
# makes the call its command line `zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR` makes, with
# max_shard_size=None instead of the CLI's "5GB": that default needs huggingface_hub (not installed here),
# and a 1.2 GB model is one file under it anyway, so the output is the same pytorch_model.bin (the CLI's
# default format; --safe_serialization refuses this checkpoint's tied head.weight/embed.weight).
# The script calls torch.load(..., mmap=True), which torch 1.13 (the host's /usr/bin/python3) lacks, so
# it runs on the host only where that python's torch has it, else in the Debian 13 chroot (torch 2.x;
# CKPTFS_CHROOT, else build/trixie or /var/cache/ckptfs/trixie, see bench/lib_bench.sh) with the checkpoint
# bind-mounted at CHROOT/tmp/ckptfs-zero-to-fp32-bench/ckpt (the same files, the same page cache).
#
# Timed, each cold (`sync; echo 3 > /proc/sys/vm/drop_caches` first: the checkpoint, the tools and their
# libraries come from disk) and then warm (every shard file cat to /dev/null first):
#   - zero_to_fp32: the process (python start, imports, the conversion, writing pytorch_model.bin), wall
#     seconds and peak RSS (GNU time -v; the mmap'ed shards it touches count too); the call's own seconds;
#   - `ckptfs export SRC OUT` (every view: model.safetensors, fp32/model.safetensors, fp32/pytorch_model.bin,
#     ~3.0 GB written against zero_to_fp32's 1.2 GB): seconds, peak RSS;
#   - mount + `cp MNT/fp32/pytorch_model.bin OUT/` (the same kind of file zero_to_fp32 writes): seconds from
#     starting ckptfs to the end of the copy, the daemon's peak RSS (VmHWM);
#   - mount + `cat MNT/fp32/model.safetensors > /dev/null` (first read): the mount's seconds (until live) and
#     the cat's, the daemon's VmHWM.
# Every mount uses -o index_cache=off (each one parses, as a first mount does). Outputs go to
# CHROOT/tmp/ckptfs-zero-to-fp32-bench/out (the same file system as the checkpoint here) and are deleted
# after each run; `sync` before every timed run, not inside it. Then, untimed: zero_to_fp32's output
# against the mount's fp32/pytorch_model.bin (same keys, dtypes, shapes and values). Takes ~3 min on 2 CPUs.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, wait_mounted, fresh_dir, find_chroot, ck_unmount, record, ...
bench_setup "${1:-}"  # $work, $bin, $read_timeout, $t_start
[ -n "${DEEPSPEED_SRC:-}" ] || {
  echo "not run: set DEEPSPEED_SRC to a DeepSpeed checkout or a bare git dir of one" >&2
  exit 2
}
[ -w /proc/sys/vm/drop_caches ] || { echo "needs a writable /proc/sys/vm/drop_caches (root)" >&2; exit 1; }
/usr/bin/python3 mount_tests/gen/generate.py "$work/fixtures" --only bench_z3_dp64 >/dev/null
src="$work/fixtures/bench_z3_dp64/checkpoint"
zwork=$work/zero_to_fp32
ds=$zwork/ds
mkdir -p "$zwork"
log=$zwork/zero_to_fp32.log
: >"$log"

warm() { find "$src" -type f -exec cat {} + >/dev/null; }

# ---- the two DeepSpeed files, from a checkout or a bare git dir -----------------------------------------
ds_files=(deepspeed/utils/zero_to_fp32.py deepspeed/checkpoint/constants.py)
rm -rf "$ds"
mkdir -p "$ds/deepspeed/utils" "$ds/deepspeed/checkpoint"
if [ -f "$DEEPSPEED_SRC/${ds_files[0]}" ]; then
  for f in "${ds_files[@]}"; do cp "$DEEPSPEED_SRC/$f" "$ds/$f.orig"; done
  ds_rev=$(git -C "$DEEPSPEED_SRC" rev-parse HEAD 2>/dev/null || echo "checkout")
elif git --git-dir="$DEEPSPEED_SRC" rev-parse --verify -q HEAD >/dev/null; then
  for f in "${ds_files[@]}"; do git --git-dir="$DEEPSPEED_SRC" show "HEAD:$f" >"$ds/$f.orig"; done
  ds_rev=$(git --git-dir="$DEEPSPEED_SRC" rev-parse HEAD)
else
  echo "DEEPSPEED_SRC=$DEEPSPEED_SRC: neither a checkout with ${ds_files[0]} nor a git dir" >&2
  exit 1
fi
mv "$ds/deepspeed/utils/zero_to_fp32.py.orig" "$ds/zero_to_fp32.py"
mv "$ds/deepspeed/checkpoint/constants.py.orig" "$ds/deepspeed/checkpoint/constants.py"
ds_date=$(git --git-dir="$DEEPSPEED_SRC" log -1 --format=%cs HEAD 2>/dev/null ||
  git -C "$DEEPSPEED_SRC" log -1 --format=%cs HEAD 2>/dev/null || echo "?")

# ---- our shim and driver (written here, at bench time) ----------------------------------------------------
cp mount_tests/gen/deepspeed_classes.py "$ds/deepspeed_classes.py"
cat >"$ds/deepspeed/__init__.py" <<'EOF'
# Written by ckptfs bench/zero_to_fp32_bench.sh (not DeepSpeed): the imports zero_to_fp32.py needs.
from . import checkpoint, utils  # noqa: F401  (ours: a logger, the constants), before the stand-ins
import deepspeed_classes  # noqa: E402  (the classes the checkpoint pickles name, from mount_tests/gen)

deepspeed_classes.install()
EOF
cat >"$ds/deepspeed/utils/__init__.py" <<'EOF'
# Written by ckptfs bench/zero_to_fp32_bench.sh (not DeepSpeed).
import logging

logger = logging.getLogger("deepspeed")
EOF
cat >"$ds/deepspeed/checkpoint/__init__.py" <<'EOF'
# Written by ckptfs bench/zero_to_fp32_bench.sh (not DeepSpeed).
from . import constants  # noqa: F401
EOF
cat >"$ds/run_zero_to_fp32.py" <<'EOF'
"""Written by ckptfs bench/zero_to_fp32_bench.sh (not DeepSpeed): makes the call DeepSpeed's
zero_to_fp32.py (next to this file) makes for `zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR`, with
max_shard_size=None (the CLI's "5GB" needs huggingface_hub; the model is one file under it anyway).
    python3 run_zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR
    python3 run_zero_to_fp32.py --check A.bin B.bin    (same keys, dtypes, shapes, values?)"""
import json
import sys
import time

t0 = time.perf_counter()
if sys.argv[1] == "--check":
    import torch

    a, b = (torch.load(p, map_location="cpu", mmap=True, weights_only=True) for p in sys.argv[2:4])
    differ = sorted(set(a) ^ set(b)) + [k for k in a if k in b and (
        a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k]))]
    print("RESULT " + json.dumps({"tensors": len(a), "tensors_other": len(b), "differ": differ[:10],
                                  "n_differ": len(differ)}), flush=True)
    sys.exit(0)
import zero_to_fp32  # noqa: E402

t1 = time.perf_counter()
zero_to_fp32.convert_zero_checkpoint_to_fp32_state_dict(sys.argv[1], sys.argv[2], max_shard_size=None)
print("RESULT " + json.dumps({"import_s": round(t1 - t0, 3), "convert_s": round(time.perf_counter() - t1, 3)}),
      flush=True)
EOF

# ---- where it runs: the host's python if its torch.load has mmap, else the chroot's ----------------------
probe='import inspect, sys, torch; sys.exit(0 if "mmap" in inspect.signature(torch.load).parameters else 1)'
inside=/tmp/ckptfs-zero-to-fp32-bench
bind_mnt=
ck_mnt=$work/mnt/zero-to-fp32
out_dir=$zwork/out
if /usr/bin/python3 -c "$probe" 2>/dev/null; then
  where="host ($(/usr/bin/python3 -c 'import torch; print("torch", torch.__version__)'))"
  py=(env PYTHONPATH="$ds" PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3)
  py_ds=$ds py_ckpt=$src py_out=$out_dir py_mnt=$ck_mnt
else
  host_torch=$(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "none")
  find_chroot  # $chroot_dir
  cwork=$chroot_dir$inside
  rm -rf "$cwork/ds" "$cwork/out"
  mkdir -p "$cwork/ckpt" "$cwork/out"
  cp -r "$ds" "$cwork/ds"
  bind_mnt=$cwork/ckpt
  ck_mnt=$cwork/mnt
  out_dir=$cwork/out
  py=(chroot "$chroot_dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
    PYTHONPATH="$inside/ds" PYTHONDONTWRITEBYTECODE=1 python3)
  py_ds=$inside/ds py_ckpt=$inside/ckpt py_out=$inside/out py_mnt=$inside/mnt
  "${py[@]}" -c "$probe" 2>>"$log" ||
    { echo "the chroot's torch.load has no mmap either (zero_to_fp32.py needs it)" >&2; exit 1; }
  where="chroot $chroot_dir ($(grep -m1 '^torch ' "$chroot_dir/.ckptfs-chroot-complete"); the host's"
  where="$where torch $host_torch has no torch.load(mmap=))"
fi
"${py[@]}" -c 'import tqdm' 2>/dev/null || {
  printf '# Written by ckptfs bench/zero_to_fp32_bench.sh: a pass-through tqdm (none installed).\n%s\n' \
    'def tqdm(iterable=None, *args, **kwargs): return iterable' >"$ds/tqdm.py"
  [ -z "$bind_mnt" ] || cp "$ds/tqdm.py" "$cwork/ds/tqdm.py"
}

# ---- cleanup: the ckptfs mount, the bind mount, the outputs ---------------------------------------------
mounts=("$ck_mnt")
pids=()
cleanup() {
  stop_and_unmount
  if [ -n "$bind_mnt" ] && is_mounted "$bind_mnt"; then umount "$bind_mnt" 2>/dev/null || umount -l "$bind_mnt"; fi
  rm -rf "$out_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ -n "$bind_mnt" ]; then
  is_mounted "$bind_mnt" || mount --bind "$src" "$bind_mnt"
  mount -o remount,bind,ro "$bind_mnt" 2>/dev/null || true
fi

# ckptfs in the foreground, in the background of this shell (its VmHWM readable); sets ck_pid, ck_mount_s
ck_mount() {
  local t0
  fresh_dir "$ck_mnt"
  t0=$EPOCHREALTIME
  "$bin" "$src" "$ck_mnt" -f -o index_cache=off 2>>"$log" &
  ck_pid=$!
  pids+=("$ck_pid")
  for _ in $(seq 30000); do
    is_mounted "$ck_mnt" && break
    kill -0 "$ck_pid" 2>/dev/null || { echo "ckptfs exited (log: $log)" >&2; return 1; }
    sleep 0.01
  done
  wait_mounted "$ck_mnt"
  ck_mount_s=$(since "$t0")
}
fresh_out() { rm -rf "$out_dir"; mkdir -p "$out_dir"; sync; }
gnu_time_field() {  # $1: file of `time -v`, $2: field label
  awk -F': ' -v k="$2" '$1 ~ k { print $2 }' "$1" | tail -n1
}

mapfile -t shards < <(find "$src" -type f -name '*.pt' | sort)
shard_bytes=$(du -cb "${shards[@]}" | tail -1 | cut -f1)
record shard_bytes "$shard_bytes"
record deepspeed_rev "$ds_rev" "$ds_date"
record interpreter "${where%% *}" "$where"
echo "checkpoint: $src, ${#shards[@]} files, $shard_bytes bytes"
echo "zero_to_fp32.py: DeepSpeed $ds_rev ($ds_date) from $DEEPSPEED_SRC; runs in the $where"
echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r); $(date -u '+%F %T UTC')"
echo

fmt='%-6s %-46s %9s %11s %14s\n'
# shellcheck disable=SC2059  # the format is the variable
printf "$fmt" state what seconds "peak RSS" "bytes written"
for state in cold warm; do
  prep() { if [ "$state" = cold ]; then drop; else warm; fi; }

  # zero_to_fp32 (the process; GNU time -v for its peak RSS)
  fresh_out
  prep
  t0=$EPOCHREALTIME
  /usr/bin/time -v -o "$zwork/time.txt" "${py[@]}" "$py_ds/run_zero_to_fp32.py" "$py_ckpt" "$py_out/zf" \
    >"$zwork/zf.out" 2>>"$log" || { tail -n 30 "$log" >&2; echo "zero_to_fp32 failed (log: $log)" >&2; exit 1; }
  s=$(since "$t0")
  rss=$(gnu_time_field "$zwork/time.txt" "Maximum resident set size")
  result=$(grep '^RESULT ' "$zwork/zf.out" | cut -d' ' -f2-)
  convert_s=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["convert_s"])' "$result")
  zf_file=$out_dir/zf/pytorch_model.bin
  [ -f "$zf_file" ] || { echo "zero_to_fp32 wrote no $zf_file: $(ls "$out_dir/zf")" >&2; exit 1; }
  zf_bytes=$(du -cb "$out_dir/zf"/* | tail -1 | cut -f1)
  record "zero_to_fp32.$state.s" "$s" "the process: python start, imports, conversion, writing"
  record "zero_to_fp32.$state.convert_s" "$convert_s" "the call alone"
  record "zero_to_fp32.$state.rss_kib" "$rss"
  record zero_to_fp32.bytes "$zf_bytes"
  # shellcheck disable=SC2059
  printf "$fmt" "$state" "zero_to_fp32.py (process; the call: ${convert_s} s)" "$s" "$(mib "$rss")" "$zf_bytes"
  if [ "$state" = warm ]; then  # untimed: its output against the mount's fp32/pytorch_model.bin
    ck_mount
    check=$("${py[@]}" "$py_ds/run_zero_to_fp32.py" --check "$py_out/zf/pytorch_model.bin" \
      "$py_mnt/fp32/pytorch_model.bin" 2>>"$log" | grep '^RESULT ' | cut -d' ' -f2-)
    ck_unmount "$ck_mnt"
    n_differ=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["n_differ"])' "$check")
    record check_n_differ "$n_differ" "$check"
    echo "       check: zero_to_fp32's pytorch_model.bin against the mount's fp32/pytorch_model.bin: $check"
  fi

  # ckptfs export (every view)
  fresh_out
  prep
  t0=$EPOCHREALTIME
  /usr/bin/time -v -o "$zwork/time.txt" "$bin" export "$src" "$out_dir/export" 2>>"$log" >/dev/null
  s=$(since "$t0")
  rss=$(gnu_time_field "$zwork/time.txt" "Maximum resident set size")
  bytes=$(find "$out_dir/export" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s }')
  record "export.$state.s" "$s" "every view"
  record "export.$state.rss_kib" "$rss"
  record export.bytes "$bytes"
  # shellcheck disable=SC2059
  printf "$fmt" "$state" "ckptfs export (every view)" "$s" "$(mib "$rss")" "$bytes"

  # mount + cp fp32/pytorch_model.bin
  fresh_out
  prep
  t0=$EPOCHREALTIME
  ck_mount
  timeout "$read_timeout" cp "$ck_mnt/fp32/pytorch_model.bin" "$out_dir/pytorch_model.bin"
  s=$(since "$t0")
  ck_unmount "$ck_mnt"
  bytes=$(size_of "$out_dir/pytorch_model.bin")
  record "mount_cp.$state.s" "$s" "ckptfs start to the end of cp fp32/pytorch_model.bin"
  record "mount_cp.$state.hwm_kib" "$ck_hwm"
  record mount_cp.bytes "$bytes"
  # shellcheck disable=SC2059
  printf "$fmt" "$state" "mount + cp fp32/pytorch_model.bin" "$s" "$(mib "$ck_hwm")" "$bytes"

  # mount + cat fp32/model.safetensors (first read)
  fresh_out
  prep
  ck_mount
  view_bytes=$(size_of "$ck_mnt/fp32/model.safetensors")
  t0=$EPOCHREALTIME
  timeout "$read_timeout" cat "$ck_mnt/fp32/model.safetensors" >/dev/null
  s=$(since "$t0")
  ck_unmount "$ck_mnt"
  record "mount_cat.$state.mount_s" "$ck_mount_s" "until live, -o index_cache=off"
  record "mount_cat.$state.cat_s" "$s" "first read of fp32/model.safetensors"
  record "mount_cat.$state.hwm_kib" "$ck_hwm"
  record mount_cat.bytes "$view_bytes"
  # shellcheck disable=SC2059
  printf "$fmt" "$state" "mount ($ck_mount_s s) + cat fp32/model.safetensors" \
    "$(awk -v a="$ck_mount_s" -v b="$s" 'BEGIN { printf "%.3f", a + b }')" "$(mib "$ck_hwm")" "0 ($view_bytes read)"
done
rm -rf "$out_dir"
echo
echo "total run time: $(since "$t_start") s"
