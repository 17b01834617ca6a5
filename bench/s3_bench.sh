#!/usr/bin/env bash
# Benchmark (not a test): a sharded checkpoint on object storage (issue 19), read three ways, in one run.
# The store: Ceph's radosgw with its POSIX driver (mount_tests/s3_gateway.py, the tests' gateway, in the
# Debian unstable chroot) on 127.0.0.1, holding the 64-rank bench checkpoint (bench_z3_dp64 of
# mount_tests/gen/generate.py: 128 shard files, 3.24 GB; every merged view is made from its 1.08 GB of fp32
# masters). Three configurations: "loopback" (clients talk to the gateway directly), "relay +1 ms" (every
# request waits 1 ms in a relay in front of it, bench/s3_delay_proxy.py: this kernel has no sch_netem for
# `tc netem`, and the slow passthrough of latency_bench.sh under the gateway's POSIX root would delay every
# 128 KiB the gateway reads from its disk, a bandwidth cap, not a per-request latency) and "relay +0 ms" (the
# same relay without the delay: what the relay itself costs, two more loopback hops per byte on 2 CPUs).
# Before the first case every object is downloaded once, not reported (a gateway that has served each object
# once for every client). Every case runs --repeat times (default 3), repetition after repetition of every
# configuration: the gateway's first passes of ranged reads are slower than its later ones (a single run made
# its first case, (a) fp32 over loopback, the slowest (a) in five runs of five), so a row is the median run and
# each ratio the median of the ratios within a repetition.
# Cases, each cold (caches dropped, fresh mounts, index cache off, no disk cache):
#   (a) `ckptfs s3://BUCKET/PREFIX MNT -o endpoint=...,s3_path_style,s3_connections=N`, then cat of
#       fp32/model.safetensors, and on another fresh mount of model.safetensors; skipped, saying why, when the
#       binary refuses s3:// (a binary without -o s3_connections mounts without it; more mount options:
#       CKPTFS_S3_OPTS="opt=v,...");
#   (b) every object downloaded with N parallel connections (one curl, --parallel, SigV4), then
#       `ckptfs export` of the local copy (every view, to WORKDIR); and "b fp32": the download, then a local
#       mount and cat of fp32/model.safetensors (the least a download-first reader pays);
#   (c) Debian's s3fs (1.90) mounting the bucket's prefix (no cache dir), ckptfs mounted on it, cat of each
#       view (fresh mounts of both).
# For (a) and (c), the bytes and requests of the mount alone (listing, parsing) are reported apart; for every
# case the bytes read from the block device under the gateway's store (what the gateway read to answer, its
# read-ahead included).
# Per case: seconds end to end (mount + read, download + export, ...), the bytes the gateway sent for GETs and
# the number of requests (its ops log, s3_gateway.Gateway.ops_log), peak RSS (VmHWM) of the daemons; then the
# issue's ratios: (a) bytes fetched / bytes needed (target <= 1.05), (b) / (a) seconds for fp32 (>= 2),
# (a)'s rate on the bytes it fetched / (b)'s download rate (>= 0.8), (c) / (a) seconds (> 1). Prints a
# markdown table, writes WORKDIR/s3/results.json and the page S3_DOC (default docs/s3-bench.md; "-": none),
# with its JSON (docs/s3-bench.json) and a plot (docs/s3-bench.png) once (a) was measured. Numbers are
# reported, never asserted. `/usr/bin/python3 bench/s3_bench.py --from-json docs/s3-bench.json --doc F`
# rewrites the page from the JSON without measuring.
#
#   bash bench/s3_bench.sh [WORKDIR] [--ranks N] [--dims V,H,F,L] [--connections N] [--repeat N]
#       WORKDIR       default build/bench (the 64-rank checkpoint is shared with the other benches)
#       --ranks N     the bench model saved at N ranks instead of 64 (generate.py's generate_bench)
#       --dims ...    the bench model's vocab,hidden,ffn,layers (default 32003,1031,4099,28); a quick check:
#                     --ranks 8 --dims 8009,515,2053,4 (50 MB of masters, 151 MB in 17 objects; ~1 min)
#       --connections N   parallel connections of every client (default 8)
#       --repeat N    runs of every case (default 3; the report gives each case's median run)
#   CKPTFS_BIN: the binary (default build/ckptfs). Root (FUSE, drop_caches, the chroot). Installs Debian's s3fs
#   with apt-get when it is missing. The full size takes ~13 min on 2 CPUs (plus ~25 s generating the
#   checkpoint once), disk ~10 GB (store, download, export). Every mount is made under WORKDIR/mnt and
#   unmounted at the end, the gateway stopped and its state (CHROOT/tmp/ckptfs-rgw-*) removed.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib_bench.sh
source bench/lib_bench.sh  # bench_setup
workdir=
opts=()
while [ $# -gt 0 ]; do
  case $1 in
    --ranks | --dims | --connections | --repeat) opts+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    -*) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    *) workdir=$1; shift ;;
  esac
done
bench_setup "$workdir"  # $work, $bin
[ "$(id -u)" -eq 0 ] || { echo "run as root (FUSE mounts, drop_caches, the chroot)" >&2; exit 1; }
sid=${CKPTFS_SID_CHROOT:-/var/cache/ckptfs/sid}
[ -x "$sid/usr/bin/radosgw" ] || {
  echo "no radosgw in the unstable chroot $sid (mount_tests/modern/setup_chroot.sh, CKPTFS_CHROOT_SUITE=sid)" >&2
  exit 1
}
command -v s3fs >/dev/null || apt-get install -y --no-install-recommends s3fs >/dev/null ||
  { echo "s3fs is needed (apt-get install s3fs failed)" >&2; exit 1; }
mkdir -p "$work/mnt"
command_line="bash bench/s3_bench.sh${workdir:+ $workdir}${opts[*]:+ ${opts[*]}}"
exec /usr/bin/python3 bench/s3_bench.py --work "$work" --bin "$bin" --doc "${S3_DOC:-docs/s3-bench.md}" \
  --command "$command_line" "${opts[@]}"
