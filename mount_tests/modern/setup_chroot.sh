#!/usr/bin/env bash
# Builds (once) a Debian 13 (trixie) chroot with modern clients: python3-torch 2.x, python3-safetensors (the
# reference Rust-backed library), python3-numpy and, where trixie has it, python3-transformers. The tests in
# mount_tests/modern/ mount ckptfs under CHROOT/mnt/ and run these clients inside the chroot.
#
#   bash mount_tests/modern/setup_chroot.sh        # chroot at ${CKPTFS_CHROOT:-build/trixie}
#
# CKPTFS_CHROOT_SUITE=sid (with another CKPTFS_CHROOT) builds the chroot from unstable, which has
# python3-transformers: then test_check_hf_load_in_chroot runs the transformers checks too.
#
# Idempotent: a complete chroot carries CHROOT/.ckptfs-chroot-complete (the stamp the tests look for, with
# the installed packages); a chroot without it (an interrupted run), or whose stamp lacks a package of
# PACKAGES, is set up again. Needs root and Debian's mirrors.
set -euo pipefail
cd "$(dirname "$0")/../.."
CHROOT="${CKPTFS_CHROOT:-build/trixie}"
case "$CHROOT" in /*) ;; *) CHROOT="$PWD/$CHROOT" ;; esac
STAMP="$CHROOT/.ckptfs-chroot-complete"
SUITE="${CKPTFS_CHROOT_SUITE:-trixie}"  # sid has python3-transformers (trixie does not)
MIRROR="${CKPTFS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=(python3 python3-torch python3-safetensors python3-numpy python3-zstandard)
# The S3 gateway of mount_tests/s3_gateway.py (issue 19): Ceph 20's radosgw, with its POSIX driver, is in sid.
if [ "$SUITE" = sid ]; then PACKAGES+=(radosgw curl); fi
# llama.cpp's converter, gguf-py and llama-completion for the gguf/ view's tests (issue 33).
if [ "$SUITE" = sid ]; then PACKAGES+=(llama.cpp-tools python3-gguf python3-sentencepiece); fi
OPTIONAL=(python3-transformers)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

report() {
  echo "setup_chroot: $CHROOT is ready (suite $SUITE):"
  cat "$STAMP"
}

# Complete for this list when the stamp names every package (a chroot cached before a package joined the
# list gets it installed, without a new debootstrap).
stamp_has_packages() {
  local p
  for p in "${PACKAGES[@]}"; do grep -q "^$p " "$STAMP" || return 1; done
}
if [ -f "$STAMP" ] && stamp_has_packages; then
  report
  exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "setup_chroot: installing debootstrap on the host"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# Anything still mounted below the chroot (a test that died) would be copied into or deleted through.
chroot_mounts() { awk -v p="$CHROOT/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo | sort -r; }
for m in $(chroot_mounts); do
  $SUDO umount -l "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null || true
done

if [ ! -x "$CHROOT/usr/bin/apt-get" ] || [ ! -f "$CHROOT/.ckptfs-debootstrap-done" ]; then
  echo "setup_chroot: debootstrap --variant=minbase $SUITE $CHROOT"
  [ -n "$(chroot_mounts)" ] && { echo "setup_chroot: mounts left below $CHROOT; unmount them" >&2; exit 1; }
  $SUDO rm -rf "$CHROOT"
  mkdir -p "$(dirname "$CHROOT")"
  $SUDO debootstrap --variant=minbase "$SUITE" "$CHROOT" "$MIRROR" >"$CHROOT.debootstrap.log" 2>&1 || {
    tail -n 30 "$CHROOT.debootstrap.log" >&2
    echo "setup_chroot: debootstrap failed (log: $CHROOT.debootstrap.log)" >&2
    exit 1
  }
  $SUDO touch "$CHROOT/.ckptfs-debootstrap-done"
fi

in_chroot() { $SUDO chroot "$CHROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }

# The chroot's apt runs as the _apt user (sandbox); resolv.conf from the host for the mirror.
$SUDO cp -L /etc/resolv.conf "$CHROOT/etc/resolv.conf" 2>/dev/null || true
echo "setup_chroot: apt-get install ${PACKAGES[*]} in the chroot"
# (a mirror snapshot of sid can carry an expired Valid-Until; the archive key still signs it)
in_chroot apt-get -o Acquire::Check-Valid-Until=false update -qq
want=("${PACKAGES[@]}")
for p in "${OPTIONAL[@]}"; do
  if [ -n "$(in_chroot apt-cache madison "$p" 2>/dev/null)" ]; then
    want+=("$p")
  else
    echo "setup_chroot: $p is not in $SUITE; skipped"
  fi
done
in_chroot apt-get install -y -qq --no-install-recommends "${want[@]}" >"$CHROOT.apt.log" 2>&1 || {
  tail -n 30 "$CHROOT.apt.log" >&2
  echo "setup_chroot: apt-get install failed in the chroot (log: $CHROOT.apt.log)" >&2
  exit 1
}
in_chroot apt-get clean

# Check that the clients import, and record their versions in the stamp.
versions="$(in_chroot python3 - <<'PY'
import importlib, sys
print(f"python {sys.version.split()[0]}")
for m in ("torch", "safetensors", "numpy", "transformers"):
    try:
        print(f"{m} {importlib.import_module(m).__version__}")
    except ImportError:
        print(f"{m} absent")
PY
)"
# (torch's UCX prints "failed to get boot id" on stdout in a chroot without /proc: keep the version lines)
versions="$(printf '%s\n' "$versions" | grep -E '^(python|torch|safetensors|numpy|transformers) ' || true)"
pkgs="$(in_chroot dpkg-query -W -f '${Package} ${Version}\n' "${want[@]}")"
printf '%s\n%s\n' "$versions" "$pkgs" | $SUDO tee "$STAMP.tmp" >/dev/null
$SUDO mv "$STAMP.tmp" "$STAMP"
report
