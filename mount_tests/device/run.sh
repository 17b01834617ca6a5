#!/usr/bin/env bash
# Device-machine check (a box with PyTorch 2.x, transformers and safetensors, e.g. a GPU machine): generates
# the Llama-shaped DeepSpeed ZeRO-3 case, mounts it with ckptfs, loads the mount with
# transformers.AutoModelForCausalLM.from_pretrained and safetensors.safe_open, compares every tensor with the
# generator's expectation bit for bit, runs a forward pass (CPU, and CUDA when there is a GPU), and always
# unmounts.
#
#   bash mount_tests/device/run.sh CKPTFS_BIN WORK_DIR [LIB_DIR] [-- CHECK_HF_LOAD_ARGS...]
#
# LIB_DIR (optional, "" for none) is put first on LD_LIBRARY_PATH: carry the ckptfs binary's shared
# libraries there (libfuse3.so.3, libfmt.so.9) when the machine lacks them.  PYTHON (default python3) is the
# interpreter with torch (the generator runs under torch 1.13 and 2.x).  CASE (default llama_z3_bf16_dp2).
# Extra arguments go to check_hf_load.py (e.g. --safetensors-only where transformers is missing).
# Exit status: 0 all checks passed; 1 a check failed; 2 usage or setup error (generator, mount).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
usage() { echo "usage: $0 CKPTFS_BIN WORK_DIR [LIB_DIR] [-- CHECK_HF_LOAD_ARGS...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
BIN="$(realpath "$1")"; WORK="$2"; shift 2
LIB_DIR=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then LIB_DIR="$1"; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
EXTRA=("$@")
PYTHON="${PYTHON:-python3}"
CASE="${CASE:-llama_z3_bf16_dp2}"
if [ -n "$LIB_DIR" ]; then
  LIB_DIR="$(realpath "$LIB_DIR")"
  export LD_LIBRARY_PATH="$LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$WORK"
WORK="$(realpath "$WORK")"
MNT="$WORK/mnt"
FIX="$WORK/fixtures"

step() { echo "== $*"; }
die() { echo "run.sh: $*" >&2; exit 2; }

step "ckptfs: $BIN (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
[ -x "$BIN" ] || die "not executable: $BIN"
timeout 30 "$BIN" --version || { ldd "$BIN" 2>&1 | grep -i "not found" >&2; die "$BIN does not run (missing shared libraries? pass LIB_DIR)"; }

step "python: $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1)"
step "generate $CASE into $FIX"
timeout 600 "$PYTHON" "$HERE/../gen/generate.py" "$FIX" --only "$CASE" || die "fixture generator failed"
SRC="$FIX/$CASE/$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["src"])' "$FIX/$CASE/case.json")"
EXPECTED="$FIX/$CASE/expected/model.pt"

is_mounted() { awk -v p="$MNT" '$5 == p {f = 1} END {exit !f}' /proc/self/mountinfo; }
server_running() { pgrep -f -x "$BIN $SRC $MNT" >/dev/null 2>&1; }
unmount() {
  is_mounted || return 0
  if command -v fusermount3 >/dev/null 2>&1; then
    timeout 60 fusermount3 -u "$MNT" 2>/dev/null || timeout 60 fusermount3 -u -z "$MNT"
  else
    timeout 60 umount "$MNT" 2>/dev/null || timeout 60 umount -l "$MNT"
  fi
  for _ in $(seq 100); do server_running || break; sleep 0.1; done
  if is_mounted; then echo "run.sh: could not unmount $MNT" >&2; else echo "== unmounted $MNT"; fi
}
trap unmount EXIT
trap 'exit 130' INT TERM

unmount  # a mount left by an earlier, killed run
mkdir -p "$MNT"
step "mount: $BIN $SRC $MNT"
[ -e /dev/fuse ] || die "/dev/fuse is missing: this machine cannot mount FUSE file systems"
timeout 120 "$BIN" "$SRC" "$MNT" || die "ckptfs mount failed (exit $?)"
is_mounted || die "ckptfs returned but $MNT is not mounted"
ls -l "$MNT" "$MNT/fp32"

step "check_hf_load.py $MNT $EXPECTED ${EXTRA[*]:-}"
timeout 600 "$PYTHON" "$HERE/check_hf_load.py" "$MNT" "$EXPECTED" "${EXTRA[@]}"
rc=$?
[ $rc -eq 124 ] && echo "run.sh: check_hf_load.py timed out" >&2
[ $rc -eq 0 ] && echo "== device check: PASS" || echo "== device check: FAIL (check_hf_load.py exit $rc)"
[ $rc -eq 0 ] || exit 1
exit 0
