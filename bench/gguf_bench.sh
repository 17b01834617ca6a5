#!/usr/bin/env bash
# Benchmark (not a test): the gguf/ view (issue 33) against model.safetensors of the same mount, and against
# the three offline steps it replaces, all in one run so the ratios compare like with like (same machine, same
# page cache). Numbers are reported, never asserted.
#
#   bash bench/gguf_bench.sh [WORKDIR] [--repeat N]
#                         (default WORKDIR: build/bench; needs root for FUSE mounts and chroot; CKPTFS_BIN
#                         overrides the binary, default build/ckptfs, copied to WORKDIR/gguf/ first so that a
#                         rebuild during the run changes nothing; --repeat N: repetitions, default 3)
#
# The model: a bf16 Llama of 0.60 GB (hidden 1024, ffn 2816, 16 layers, 16 heads in 4 KV groups, untied, GPT-2's
# real 50,257-token tokenizer: every row a multiple of 32, so q8_0 quantizes every matrix), written by
# transformers 5.12's save_pretrained through mount_tests/gen_gguf/make_hf_dir.py in the Debian unstable chroot
# (CKPTFS_SID_CHROOT, default /var/cache/ckptfs/sid; ~1 min the first time), into WORKDIR/gguf/hf, reused while
# WORKDIR/gguf/hf.complete names SPEC below. A plain HF directory is the strictest source for the ratio: its
# model.safetensors is served nearly as a passthrough, so the ratio is the price of the conversion alone.
#
# Each repetition, with the source in the page cache (read once, untimed, before every repetition), a fresh
# mount (-f, -o index_cache=off) per file and one first read (cat > /dev/null) of model.safetensors, then of
# gguf/*-BF16.gguf, then of gguf/*-Q8_0.gguf: seconds, GB/s of the file's own bytes, the daemon's VmHWM and CPU
# seconds for the read. The ratio is model.safetensors' seconds over the gguf/ file's, within a repetition (how
# much of the speed of serving the weights a converted file keeps: the targets are 0.8 for bf16 and 0.5 for
# q8_0), then its median over the repetitions.
#
# Then once, the offline path a user takes without ckptfs, into the chroot's /tmp (peak ~2 GB of disk), from
# the HF directory (what a training checkpoint needs an export for first): Debian's convert_hf_to_gguf.py
# --outtype bf16 (llama.cpp-tools 0.7.0), llama-quantize to Q8_0; and the converter's own --outtype q8_0 in
# one step: seconds and peak RSS (GNU time) of each. Every mount is made under WORKDIR/mnt and unmounted on exit, error or signal. Takes ~3 min
# on 2 CPUs with 3 repetitions. Run it twice, and note the load average it prints.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # mount_ckptfs, ck_unmount, timed_cat, add, summary, med, ...
SPEC="gguf-bench-1 llama bf16 h1024 f2816 l16 h16/4 gpt2"  # change when the model below changes
repeat=3
parse_repeat "$@"  # $repeat (--repeat N) and $args (the rest)
bench_setup "${args[0]:-}"  # $work, $bin, $read_timeout, $t_start
dir=$work/gguf
src=$dir/hf
mnt=$work/mnt/gguf
log=$dir/ckptfs.log
sid=${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}
inside=/tmp/ckptfs-gguf-bench  # the chroot's view of the staging folder
converter=/usr/share/doc/llama.cpp-tools/scripts/convert_hf_to_gguf.py
mkdir -p "$dir" "$work/mnt"
: >"$log"
grep -qs '^llama.cpp-tools ' "$sid/.ckptfs-chroot-complete" || {
  echo "no Debian unstable chroot with llama.cpp-tools at $sid (CKPTFS_SID_CHROOT; mount_tests/modern/setup_chroot.sh)" >&2
  exit 1
}
# a command in the chroot, as the tests run it (the converter's float32 pow as on any CPU)
in_sid=(chroot "$sid" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 ATEN_CPU_CAPABILITY=default
  HF_HUB_OFFLINE=1)

mounts=("$mnt")
pids=()
cleanup() {
  stop_and_unmount
  rm -rf "$dir/ckptfs.$$" "$sid$inside"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$bin" "$dir/ckptfs.$$"
bin=$dir/ckptfs.$$

# ---- the model: written once in the chroot, reused while its stamp names SPEC ------------------------------
if [ "$(cat "$src.complete" 2>/dev/null)" != "$SPEC" ]; then
  echo "writing the model with transformers in $sid into $src ..."
  rm -rf "$src" "$src.complete" "$sid$inside"
  mkdir -p "$sid$inside"
  cp -r mount_tests/gen_gguf "$sid$inside/"
  cat >"$sid$inside/case.json" <<EOF
{"arch": "llama", "dtype": "bfloat16", "layers": 16, "hidden": 1024, "intermediate": 2816, "heads": 16,
 "kv_heads": 4, "tied": false, "seed": 7, "tokenizer": "$inside/gen_gguf/tokenizers/gpt2"}
EOF
  "${in_sid[@]}" python3 "$inside/gen_gguf/make_hf_dir.py" "$inside/case.json" "$inside/hf" >"$dir/generate.log" 2>&1 || {
    tail -n 30 "$dir/generate.log" >&2
    exit 1
  }
  mv "$sid$inside/hf" "$src"
  sync
  echo "$SPEC" >"$src.complete"
fi
model=$src/model.safetensors
model_bytes=$(size_of "$model")
echo "source: $src (transformers save_pretrained: $(gb "$model_bytes") bf16 model.safetensors, GPT-2's tokenizer)"
echo "  $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg) at the start; $repeat repetitions"
echo "  binary: $(realpath "${CKPTFS_BIN:-build/ckptfs}") ($("$bin" --version 2>&1 | head -n1)), run from a copy"
echo

# ---- first reads through fresh mounts ---------------------------------------------------------------------
mount_ckptfs "$src" "$mnt" "$log"
bf16=$(cd "$mnt" && ls gguf/*-BF16.gguf)
q8=$(cd "$mnt" && ls gguf/*-Q8_0.gguf)
ck_unmount "$mnt"
files=(model.safetensors "$bf16" "$q8")
declare -A res label=([model.safetensors]=model ["$bf16"]=bf16 ["$q8"]=q8_0)  # label: the records' keys
for ((rep = 1; rep <= repeat; rep++)); do
  cat "$model" >/dev/null
  for f in "${files[@]}"; do
    mount_ckptfs "$src" "$mnt" "$log"
    bytes=$(size_of "$mnt/$f")
    cpu0=$(cpu_of "$ck_pid")
    t=$(timed_cat "$mnt/$f")
    read -r user sys < <(cpu_since "$ck_pid" "$cpu0")
    ck_unmount "$mnt"
    add "$f.bytes" "$bytes"
    add "$f.s" "$t"
    add "$f.gbs" "$(rate "$bytes" "$t")"
    add "$f.hwm" "$((ck_hwm / 1024))"
    add "$f.cpu" "$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')"
    add "$f.mount" "$mount_s"
    record "rep$rep.${label[$f]}.first_s" "$t" "$bytes bytes; fresh mount of $mount_s s; VmHWM $ck_hwm KiB; CPU $user+$sys s"
  done
  for f in "$bf16" "$q8"; do
    add "$f.ratio" "$(ratio "${res[model.safetensors.s]##* }" "${res[$f.s]##* }")"
  done
  echo "  repetition $rep/$repeat: model.safetensors ${res[model.safetensors.s]##* } s, $bf16 ${res[$bf16.s]##* } s," \
    "$q8 ${res[$q8.s]##* } s (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo
echo "medians of $repeat repetitions [min-max]; a fresh mount per first read, the source in the page cache"
for f in "${files[@]}"; do
  printf '%-28s %11s bytes: %s s, %s GB/s; daemon VmHWM %s MiB, CPU %s s; mount %s s\n' "$f" \
    "${res[$f.bytes]%% *}" "$(summary "$f.s" 3)" "$(summary "$f.gbs")" "$(summary "$f.hwm" 0)" \
    "$(summary "$f.cpu")" "$(summary "$f.mount" 3)"
  record "${label[$f]}.bytes" "${res[$f.bytes]%% *}" "$f"
  record "${label[$f]}.first_s" "$(med "$f.s" 3)" "median of $repeat: ${res[$f.s]}"
done
for f in "$bf16" "$q8"; do
  echo "model.safetensors' seconds / $f's: $(summary "$f.ratio")"
  record "${label[$f]}.ratio_to_model" "$(med "$f.ratio")" "median of $repeat: ${res[$f.ratio]}"
done
echo

# ---- the offline path, once ------------------------------------------------------------------------------
offline() {  # NAME command...: timed under GNU time in the chroot; prints "SECONDS PEAK_MIB"
  local name=$1 t0
  shift
  sync
  t0=$EPOCHREALTIME
  /usr/bin/time -f '%M' -o "$dir/$name.rss" "$@" >"$dir/$name.log" 2>&1 || { tail -n 20 "$dir/$name.log" >&2; exit 1; }
  echo "$(since "$t0") $(($(tail -n1 "$dir/$name.rss") / 1024))"
}
rm -rf "$sid$inside" && mkdir -p "$sid$inside/out"
cp -r "$src" "$sid$inside/hf"  # untimed: the source is already the HF directory the converter takes
read -r conv_s conv_mib < <(offline convert "${in_sid[@]}" python3 "$converter" "$inside/hf" --outtype bf16 --outfile "$inside/out/bf16.gguf")
read -r quant_s quant_mib < <(offline quantize "${in_sid[@]}" llama-quantize "$inside/out/bf16.gguf" "$inside/out/q8_0.gguf" Q8_0)
read -r direct_s direct_mib < <(offline direct "${in_sid[@]}" python3 "$converter" "$inside/hf" --outtype q8_0 --outfile "$inside/out/direct-q8_0.gguf")
two=$(awk -v b="$conv_s" -v c="$quant_s" 'BEGIN { printf "%.1f", b + c }')
echo "offline: convert_hf_to_gguf --outtype bf16 $conv_s s (peak $conv_mib MiB); llama-quantize Q8_0 $quant_s s" \
  "(peak $quant_mib MiB): $two s in all, $(gb "$(($(size_of "$sid$inside/out/bf16.gguf") + \
  $(size_of "$sid$inside/out/q8_0.gguf")))") written (from a training checkpoint, an export to HF comes first)"
echo "offline: convert_hf_to_gguf --outtype q8_0 in one step: $direct_s s (peak $direct_mib MiB)"
echo "ckptfs: mount + first read of $q8: $(awk -v m="$(med "$q8.mount" 3)" -v r="$(med "$q8.s" 3)" \
  'BEGIN { printf "%.1f", m + r }') s (medians), nothing written"
record offline_convert_quantize_s "$two" "convert bf16 $conv_s + quantize $quant_s"
record offline_convert_peak_mib "$conv_mib"
record offline_direct_q8_s "$direct_s" "peak $direct_mib MiB"
echo
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; total run time: $(since "$t_start") s"
