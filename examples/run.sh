#!/usr/bin/env bash
# README's first command: build ckptfs, mount the bundled DeepSpeed ZeRO-3 example checkpoint, look at
# the merged files with ls/du, load the merged weights and a file of the universal/ tree with torch.load,
# unmount; then inspect the bundled universal checkpoint (written by DeepSpeed's ds_to_universal), the
# bundled PyTorch DCP checkpoint (written by torch.distributed.checkpoint), the lone torch.save file and
# the bundled Megatron-LM TP2 x PP2 save dir, the bundled verl FSDP2 save dir and the others (MoE, HF
# storage, FSDP per-rank, Megatron-Bridge, gguf/ for llama.cpp, whose llama-completion runs on the mount where
# llama.cpp is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests run this script against an existing binary (CKPTFS_BIN) and skip the set-up.
# Only what the demo needs: the build tools and libraries (not the test and CI tools), the ckptfs binary (not
# the unit tests).
if [ -z "${CKPTFS_BIN:-}" ]; then
  bash .ci/install-deps --demo
  cmake -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target ckptfs -j"$(nproc)"
fi
bin=${CKPTFS_BIN:-build/ckptfs}
src=examples/deepspeed-zero3-bf16
mnt=$(mktemp -d /tmp/ckptfs-example.XXXXXX)
trap 'fusermount3 -u "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true' EXIT
"$bin" "$src" "$mnt"
echo "\$ ls -lR $mnt"
ls -lR "$mnt"
echo "\$ du -sh $mnt"
du -sh "$mnt"
echo "\$ torch.load($mnt/fp32/pytorch_model.bin, weights_only=True)"
/usr/bin/python3 - "$mnt" <<'PY'
import sys, torch
sd = torch.load(f"{sys.argv[1]}/fp32/pytorch_model.bin", weights_only=True)
for name, t in sd.items():
    print(f"  {name:32} {str(t.dtype):15} {tuple(t.shape)}")
print(f"{len(sd)} tensors, {sum(t.numel() for t in sd.values())} elements")
PY
uni="$mnt/universal/$(cat "$mnt/universal/latest_universal")"
echo "\$ torch.load($uni/zero/embed.weight/exp_avg.pt)   (ZeRO-3: a bare tensor)"
/usr/bin/python3 - "$uni" <<'PY'
import os, sys, torch
t = torch.load(f"{sys.argv[1]}/zero/embed.weight/exp_avg.pt", weights_only=True)
print(f"  exp_avg of embed.weight: {t.dtype} {tuple(t.shape)}")
print(f"  universal params: {len(os.listdir(sys.argv[1] + '/zero')) - 1}")
PY
echo "\$ ckptfs inspect examples/deepspeed-universal-z2-bf16"
"$bin" inspect examples/deepspeed-universal-z2-bf16
echo "\$ ckptfs inspect examples/dcp-shard1-ws2"
"$bin" inspect examples/dcp-shard1-ws2
echo "\$ ckptfs inspect examples/torch-save-file/full_state.pt"
"$bin" inspect examples/torch-save-file/full_state.pt
echo "\$ ckptfs inspect examples/megatron-tp2-pp2"
"$bin" inspect examples/megatron-tp2-pp2
echo "\$ ckptfs inspect examples/verl-fsdp2-ws2"
"$bin" inspect examples/verl-fsdp2-ws2
echo "\$ ckptfs inspect examples/deepspeed-moe-ep2"
"$bin" inspect examples/deepspeed-moe-ep2
echo "\$ ckptfs inspect examples/dcp-hf-storage-ws2"
"$bin" inspect examples/dcp-hf-storage-ws2
echo "\$ ckptfs inspect examples/fsdp-local-llama-ws2"
"$bin" inspect examples/fsdp-local-llama-ws2
echo "\$ ckptfs inspect examples/megatron-bridge-qwen3moe-ep2"
"$bin" inspect examples/megatron-bridge-qwen3moe-ep2
echo "\$ ckptfs inspect examples/fsdp-llama-gguf"
"$bin" inspect examples/fsdp-llama-gguf
# llama.cpp straight from a training checkpoint's mount (gguf/), where llama.cpp is installed (Debian 13 and
# later: apt-get install llama.cpp-tools)
if command -v llama-completion >/dev/null; then
  fusermount3 -u "$mnt"
  "$bin" examples/fsdp-llama-gguf "$mnt"
  echo "\$ llama-completion -m $mnt/gguf/Hf-805K-BF16.gguf -p 'Hello world' -n 8 --temp 0"
  llama-completion -m "$mnt/gguf/Hf-805K-BF16.gguf" -p "Hello world" -n 8 --temp 0 -no-cnv --no-warmup 2>/dev/null
  echo
else
  echo "(llama.cpp is not installed: llama-completion -m MNT/gguf/Hf-805K-BF16.gguf is the next step, docs/formats/gguf.md)"
fi
