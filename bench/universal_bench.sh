#!/usr/bin/env bash
# Benchmark (not a test): the universal/ tree of a generated ZeRO-2 checkpoint with 20,480 trainable
# parameters (mount_tests/gen/generate.py case many_params_z2_dp2: 81,922 files under universal/), in one
# run, against reading its optimizer shards:
#   - cat of the optimizer shards to /dev/null (warm page cache): the floor for reading every byte;
#   - mount: `ckptfs SRC MNT` until the mount is live (index + build the tree of ~164,000 entries);
#   - ls -lR MNT/universal and du -s MNT (metadata only, no shard byte read);
#   - cp -r MNT/universal/<tag>_universal to WORKDIR/copy (every file read: fp32 masters and Adam moments),
#     and, as the baseline for so many small files, cp -r of that copy (a plain directory, warm cache);
#   - peak RSS (VmHWM) of the ckptfs daemon after all of it, and of `cp` (GNU time).
# ds_to_universal.py needs, for the same checkpoint, DeepSpeed + torch installed and a temporary copy of
# every fragment of the optimizer state (its tmp/ dir) before it writes the same tree a second time.
#
#   bash bench/universal_bench.sh [WORKDIR]   (default build/bench; root, for FUSE; CKPTFS_BIN overrides
#                                             the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib_bench.sh  # record
work=$(realpath -m "${1:-build/bench}")
bin=$(realpath "${CKPTFS_BIN:-build/ckptfs}")
mkdir -p "$work"
/usr/bin/python3 mount_tests/gen/generate.py "$work" --only many_params_z2_dp2 >/dev/null
src="$work/many_params_z2_dp2/checkpoint"
mnt="$work/mnt-universal"
mkdir -p "$mnt"
fusermount3 -u "$mnt" 2>/dev/null || true
trap 'fusermount3 -u "$mnt" 2>/dev/null || true; rm -rf "$work/copy" "$work/copy2"' EXIT

now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc; }
shards=("$src"/*/*optim_states.pt)
shard_bytes=$(cat "${shards[@]}" | wc -c)
cat "${shards[@]}" >/dev/null
t0=$(now); cat "${shards[@]}" >/dev/null; t1=$(now)
cat_s=$(elapsed "$t0" "$t1")

t0=$(now); "$bin" "$src" "$mnt"; t1=$(now)
mount_s=$(elapsed "$t0" "$t1")
pid=$(pgrep -f "^$bin $src $mnt" | head -1)
t0=$(now); files=$(ls -lR "$mnt/universal" | grep -c '^-'); t1=$(now)
ls_s=$(elapsed "$t0" "$t1")
t0=$(now); du -s "$mnt" >/dev/null; t1=$(now)
du_s=$(elapsed "$t0" "$t1")
rm -rf "$work/copy"
tag_dir=$(cat "$mnt/universal/latest_universal")
t0=$(now); /usr/bin/time -f '%M' -o "$work/cp.rss" cp -r "$mnt/universal/$tag_dir" "$work/copy"; t1=$(now)
cp_s=$(elapsed "$t0" "$t1")
copied=$(du -sb "$work/copy" | cut -f1)
rm -rf "$work/copy2"
t0=$(now); cp -r "$work/copy" "$work/copy2"; t1=$(now)
plain_s=$(elapsed "$t0" "$t1")
rm -rf "$work/copy2"
daemon_kib=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")

record files "$files"
record copied_bytes "$copied"
record shard_bytes "$shard_bytes"
record cat_shards_s "$cat_s"
record mount_s "$mount_s"
record ls_lR_s "$ls_s"
record du_s "$du_s"
record cp_universal_s "$cp_s" "cp -r MNT/universal/<tag>_universal"
record cp_plain_s "$plain_s" "cp -r of the same tree from a plain directory"
record daemon_hwm_kib "$daemon_kib"
printf 'universal/ of %s: %s files, %s bytes copied\n' "many_params_z2_dp2" "$files" "$copied"
printf '%-44s %8.3f s   (%s bytes, %.2f GB/s)\n' "cat of the optimizer shards (warm)" "$cat_s" "$shard_bytes" \
  "$(echo "$shard_bytes / $cat_s / 1000000000" | bc -l)"
printf '%-44s %8.3f s\n' "mount (index + tree)" "$mount_s" "ls -lR universal/" "$ls_s" "du -s MNT" "$du_s"
printf '%-44s %8.3f s   (%.1f x the cat of the shards, %.2f x cp -r of a plain copy)\n' \
  "cp -r universal/<tag>_universal" "$cp_s" "$(echo "$cp_s / $cat_s" | bc -l)" "$(echo "$cp_s / $plain_s" | bc -l)"
printf '%-44s %8.3f s\n' "cp -r of the same tree from a plain directory" "$plain_s"
printf '%-44s %8d KiB\n' "ckptfs daemon peak RSS" "$daemon_kib" "cp peak RSS" "$(cat "$work/cp.rss")"
