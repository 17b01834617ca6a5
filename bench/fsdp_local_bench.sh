#!/usr/bin/env bash
# Benchmark (not a test): ckptfs on an FSDP1 LOCAL_STATE_DICT save (one rank{R}.pt per rank, issue 31) of a
# Llama-style model of 1.31 GB in float32 (326.6 M parameters: vocab 32003, hidden 1036, ffn 2771, 22 layers,
# 14 heads in 7 query groups), 4 ranks, written by real torch 2.14 FSDP (use_orig_params=True, bf16
# MixedPrecision, one unit per decoder layer: every unit's flat parameter has alignment padding), with
# config.json beside it, which ckptfs cuts the flat parameters by. Against cat of the same rank files, all in
# one run so the ratios compare like with like (same machine, same page cache). Numbers are reported, never
# asserted.
#
#   bash bench/fsdp_local_bench.sh [WORKDIR] [--repeat N]
#                         (default WORKDIR: build/bench; needs root for FUSE mounts, the bdi readahead knob
#                         and chroot; CKPTFS_BIN overrides the binary, default build/ckptfs, copied to
#                         WORKDIR/fsdp_local/ first so that a rebuild during the run changes nothing;
#                         --repeat N: repetitions, default 5)
#
# The checkpoint: bench/fsdp_local_checkpoint.py (its docstring says what it writes), run in the Debian
# unstable chroot with torch 2.14 and transformers (CKPTFS_SID_CHROOT, default /var/cache/ckptfs/sid) from a
# copy staged in the chroot's /tmp/ckptfs-fsdp-local-bench/ (4 ranks spawned by torch.multiprocessing, gloo on
# CPU; ~65 s on 2 CPUs, ~7 GB of memory), then moved to WORKDIR/fsdp_local/ckpt and reused while
# WORKDIR/fsdp_local/ckpt.complete names the generator's SPEC_VERSION. The chroot is needed only to generate.
#
# Each repetition, with the rank files in the page cache (read once, untimed, before every repetition):
#   - cat of the 4 rank files to /dev/null: the baseline, GB/s of the rank files' bytes;
#   - for model.safetensors and fp32/pytorch_model.bin (both float32 here: FSDP keeps float32 flat
#     parameters under mixed precision), a fresh mount (-f, -o index_cache=off so that every mount parses
#     the rank files) and its seconds until live (polled every 10 ms), the daemon's VmRSS right after, the
#     first read (cat > /dev/null) of the view, the daemon's VmRSS after it and its VmHWM at the unmount, and
#     the CPU seconds it used for the read, user and system (/proc/PID/stat; its rchar in /proc/PID/io stays
#     near 0: it splices the rank files' pages into /dev/fuse, and the kernel copies them there);
#   - `ckptfs cat CKPT model.safetensors | cat > /dev/null` (no FUSE; its parse of the rank files included,
#     as the mount's seconds are not in the first read's) and its peak RSS (GNU time), against cat too and
#     against `cat RANK_FILES | cat > /dev/null`, the same bytes through a pipe.
# Then per figure the median over the repetitions and the [min-max], in GB/s of the view's own bytes (the
# views are 1.00x the rank files' parameter bytes, each rank file also holds its pickle and zip records);
# each ratio to cat is taken within a repetition, then its median. No dropped-caches variant (the page cache
# is warm throughout) and no passthrough_ll floor (bench/mount_bench.sh and bench/megatron_bench.sh have it).
# Every mount is made under WORKDIR/mnt and unmounted on exit, error or signal. Takes ~15 s on 2 CPUs with
# the default 5 repetitions (plus the generation the first time). Disk: 1.31 GB (2.6 GB while generating).
# Run it twice, and note the load average it prints: a shared machine moves single figures by a third.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # is_mounted, unmount, fresh_dir, readahead_of, since, rate, ratio, timed_cat, ...
repeat=5
parse_repeat "$@"  # $repeat (--repeat N) and $args (the rest)
bench_setup "${args[0]:-}"  # $work, $bin, $read_timeout, $t_start
dir=$work/fsdp_local
ckpt=$dir/ckpt
mnt=$work/mnt/fsdp-local
log=$dir/ckptfs.log
sid=${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}
inside=/tmp/ckptfs-fsdp-local-bench  # the generator's folder as the chroot sees it
mkdir -p "$dir" "$work/mnt"
: >"$log"

# ---- cleanup: the mount made here unmounted, the daemons started here stopped, the copies removed ----------
mounts=("$mnt")
pids=()
cleanup() {
  stop_and_unmount
  rm -rf "$dir/ckptfs.$$" "$dir/cat.rss" "$sid$inside"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$bin" "$dir/ckptfs.$$"  # the binary under test, as it is now
bin=$dir/ckptfs.$$

# ---- workload: generated once in the chroot, reused while its stamp names the generator's spec -----------
spec=$(sed -n 's/^SPEC_VERSION = "\([^"]*\)".*/\1/p' bench/fsdp_local_checkpoint.py)
if [ "$(head -n1 "$ckpt.complete" 2>/dev/null)" != "$spec" ]; then
  if ! grep -qs '^python3-transformers ' "$sid/.ckptfs-chroot-complete"; then
    echo "no Debian unstable chroot with torch and transformers at $sid (CKPTFS_SID_CHROOT)" >&2
    exit 1
  fi
  avail=$(df --output=avail -B1 "$work" "$sid/tmp" | tail -n +2 | sort -n | head -n1)
  [ "$avail" -gt 3000000000 ] || { echo "$(gb "$avail") free under $work or $sid/tmp; ~3 GB needed" >&2; exit 1; }
  echo "generating the checkpoint in $sid (4 ranks, gloo on CPU) into $ckpt ..."
  rm -rf "$ckpt" "$ckpt.complete" "$sid$inside"
  mkdir -p "$sid$inside"
  cp bench/fsdp_local_checkpoint.py "$sid$inside/"
  # torch's warnings (deprecations, UCX and cpuinfo without /proc) go to the log, shown when it fails
  if ! made=$(chroot "$sid" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USE_LIBUV=0 OMP_NUM_THREADS=1 \
    FSDP_BENCH_PORT=$((20000 + RANDOM % 20000)) python3 "$inside/fsdp_local_checkpoint.py" generate \
    "$inside/ckpt" 2>"$dir/generate.log"); then
    tail -n 30 "$dir/generate.log" >&2
    echo "the generator failed in $sid (log: $dir/generate.log)" >&2
    exit 1
  fi
  made=$(grep '^{' <<<"$made")  # (UCX prints its complaints about the missing /proc on stdout)
  mv "$sid$inside/ckpt" "$ckpt"
  sync  # no writeback of the fresh checkpoint during the timed runs
  printf '%s\n%s\n%s\n' "$spec" "$made" "$(grep -m1 '^torch ' "$sid/.ckptfs-chroot-complete")" >"$ckpt.complete"
  echo "  $made"
fi
mapfile -t ranks < <(find "$ckpt" -name 'rank*.pt' | sort -V)
rank_bytes=$(cat "${ranks[@]}" | wc -c)  # also warms the page cache
param_bytes=$(sed -n 2p "$ckpt.complete" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["fp32_bytes"])')
resident() {  # bytes of the rank files in the page cache (util-linux fincore)
  fincore -b -n -o RES "${ranks[@]}" | awk '{ s += $1 } END { printf "%.0f", s }'
}

echo "source: $ckpt (FSDP1 LOCAL_STATE_DICT, use_orig_params, bf16 MixedPrecision; $(sed -n 3p "$ckpt.complete"))"
echo "  ${#ranks[@]} rank files, $rank_bytes bytes ($(gb "$rank_bytes")), $param_bytes bytes of float32 parameters"
echo "  $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg) at the start, kernel $(uname -r); $repeat repetitions"
echo "  binary: $(realpath "${CKPTFS_BIN:-build/ckptfs}") ($("$bin" --version 2>&1 | head -n1)), run from a copy"
record rank_bytes "$rank_bytes" "${#ranks[@]} rank files"
record param_bytes "$param_bytes" "float32 parameters"
echo

# ---- the runs -------------------------------------------------------------------------------------------
views=(model.safetensors fp32/pytorch_model.bin)
declare -A res  # "FIGURE" -> the repetitions' values, space-separated (add, summary, med: lib_bench.sh)
for ((rep = 1; rep <= repeat; rep++)); do
  cat "${ranks[@]}" >/dev/null
  add resident_before "$(resident)"
  t=$(timed_cat "${ranks[@]}")
  cat_gbs=$(rate "$rank_bytes" "$t")
  add cat "$cat_gbs"
  record "rep$rep.cat_s" "$t" "the rank files, page cache"
  for view in "${views[@]}"; do
    mount_ckptfs "$ckpt" "$mnt" "$log"
    rss0=$(stat_of "$ck_pid" VmRSS)
    bytes=$(size_of "$mnt/$view")
    ra=$(readahead_of "$mnt")
    cpu0=$(cpu_of "$ck_pid")
    t=$(timed_cat "$mnt/$view")
    read -r user sys < <(cpu_since "$ck_pid" "$cpu0")
    rss1=$(stat_of "$ck_pid" VmRSS)
    ck_unmount "$mnt"
    r=$(rate "$bytes" "$t")
    add "$view.bytes" "$bytes"
    add "$view.mount" "$mount_s"
    add "$view.gbs" "$r"
    add "$view.ratio" "$(ratio "$r" "$cat_gbs")"
    add "$view.rss_mounted" "$((rss0 / 1024))"
    add "$view.rss_read" "$((rss1 / 1024))"
    add "$view.hwm" "$((ck_hwm / 1024))"
    add "$view.user" "$user"
    add "$view.sys" "$sys"
    record "rep$rep.$view.first_s" "$t" "$bytes bytes; fresh mount of $mount_s s, read_ahead_kb=$ra; daemon VmRSS\
 $rss0 KiB mounted, $rss1 KiB after, VmHWM $ck_hwm KiB; daemon CPU $user s user, $sys s system"
  done
  t0=$EPOCHREALTIME
  timeout "$read_timeout" cat "${ranks[@]}" | cat >/dev/null
  t=$(since "$t0")
  cat_pipe_gbs=$(rate "$rank_bytes" "$t")
  add cat_pipe "$cat_pipe_gbs"
  record "rep$rep.cat_pipe_s" "$t" "cat of the rank files | cat > /dev/null"
  t0=$EPOCHREALTIME
  /usr/bin/time -f '%M' -o "$dir/cat.rss" timeout "$read_timeout" "$bin" cat "$ckpt" model.safetensors 2>>"$log" |
    cat >/dev/null
  t=$(since "$t0")
  r=$(rate "${res[model.safetensors.bytes]%% *}" "$t")
  add pipe "$r"
  add pipe.ratio "$(ratio "$r" "$cat_gbs")"
  add pipe.ratio_pipe "$(ratio "$r" "$cat_pipe_gbs")"
  add pipe.s "$t"
  add pipe.hwm "$(($(tail -n1 "$dir/cat.rss") / 1024))"
  record "rep$rep.ckptfs_cat_pipe_s" "$t" "ckptfs cat model.safetensors | cat > /dev/null, parse included"
  echo "  repetition $rep/$repeat: cat $cat_gbs GB/s; model.safetensors ${res[model.safetensors.gbs]##* }," \
    "fp32/pytorch_model.bin ${res[fp32/pytorch_model.bin.gbs]##* }; cat | cat $cat_pipe_gbs, ckptfs cat | cat $r GB/s" \
    "(load $(cut -d' ' -f1 /proc/loadavg))"
done
echo

# ---- medians ------------------------------------------------------------------------------------------
echo "medians of $repeat repetitions [min-max]; GB/s of each file's own bytes; ratios to cat within a repetition"
echo "cat of the ${#ranks[@]} rank files > /dev/null (page cache; $(gb "$(med resident_before 0)") of" \
  "$(gb "$rank_bytes") resident before):  $(summary cat) GB/s"
record cat_gbs "$(med cat)" "median of $repeat: ${res[cat]}"
for view in "${views[@]}"; do
  printf 'ckptfs first read %-23s %s bytes: %s GB/s; / cat %s\n' "$view" "${res[$view.bytes]%% *}" \
    "$(summary "$view.gbs")" "$(summary "$view.ratio")"
  echo "  mount (parse ${#ranks[@]} rank files, until live): $(summary "$view.mount" 3) s;" \
    "daemon VmRSS $(summary "$view.rss_mounted" 0) MiB mounted, $(summary "$view.rss_read" 0) MiB after the read," \
    "VmHWM $(summary "$view.hwm" 0) MiB; daemon CPU for the read $(summary "$view.user") s user," \
    "$(summary "$view.sys") s system"
  record "$view.gbs" "$(med "$view.gbs")" "median of $repeat: ${res[$view.gbs]}"
  record "$view.ratio_to_cat" "$(med "$view.ratio")" "median of $repeat: ${res[$view.ratio]}"
  record "$view.mount_s" "$(med "$view.mount" 3)" "median of $repeat: ${res[$view.mount]}"
  record "$view.rss_mounted_mib" "$(med "$view.rss_mounted" 0)" "median of $repeat: ${res[$view.rss_mounted]}"
  record "$view.rss_read_mib" "$(med "$view.rss_read" 0)" "median of $repeat: ${res[$view.rss_read]}"
done
echo "cat of the rank files | cat > /dev/null: $(summary cat_pipe) GB/s"
echo "ckptfs cat CKPT model.safetensors | cat > /dev/null (parse included): $(summary pipe) GB/s" \
  "($(summary pipe.s 3) s); / cat $(summary pipe.ratio); / cat | cat $(summary pipe.ratio_pipe);" \
  "peak RSS $(summary pipe.hwm 0) MiB"
record ckptfs_cat_pipe_gbs "$(med pipe)" "median of $repeat: ${res[pipe]}"
record ckptfs_cat_pipe_ratio_to_cat "$(med pipe.ratio)" "median of $repeat: ${res[pipe.ratio]}"
record cat_pipe_gbs "$(med cat_pipe)" "median of $repeat: ${res[cat_pipe]}"
echo
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; total run time: $(since "$t_start") s"
