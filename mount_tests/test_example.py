"""README's first command: examples/run.sh mounts the bundled example and loads the merged weights."""
import os
import re
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def test_example_script_mounts_lists_and_loads(ckptfs_bin, fixtures_dir):
    env = dict(os.environ, CKPTFS_BIN=str(ckptfs_bin))
    run = subprocess.run(["bash", str(REPO / "examples" / "run.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for name in ("model.safetensors", "pytorch_model.bin", "config.json", "tokenizer.json", "ckptfs.json"):
        assert name in out
    assert re.search(r"^\S+\s+/tmp/ckptfs-example", out, re.M), "du -sh line missing"
    # The example is the generator's z3_bf16_dp2 checkpoint: its expectation lists every tensor.
    expected = torch.load(Path(fixtures_dir) / "z3_bf16_dp2" / "expected" / "fp32.pt")
    assert f"{len(expected)} tensors, {sum(t.numel() for t in expected.values())} elements" in out
    for name in expected:
        assert re.search(rf"^\s+{re.escape(name)}\s", out, re.M)
    # universal/: ZeRO-3 keeps bare 1-D tensors; the example's embedding is 101 x 37
    assert "exp_avg of embed.weight: torch.float32 (3737,)" in out
    universal = torch.load(Path(fixtures_dir) / "z3_bf16_dp2" / "expected" / "universal.pt")
    assert f"universal params: {len(universal)}" in out
    # the bundled universal checkpoint is read as input
    assert "format:     DeepSpeed universal checkpoint (ds_to_universal output)" in out
    assert re.search(r"^\s+fp32/pytorch_model\.bin\s+\d+ bytes", out, re.M)


def test_dcp_example_is_inspected(ckptfs_bin):
    env = dict(os.environ, CKPTFS_BIN=str(ckptfs_bin))
    run = subprocess.run(["bash", str(REPO / "examples" / "run.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = run.stdout[run.stdout.index("$ ckptfs inspect examples/dcp-shard1-ws2"):]
    assert "format:     PyTorch distributed checkpoint (torch.distributed.checkpoint)" in out
    assert re.search(r"^\s+full_state\.pt\s+\d+ bytes", out, re.M)
    # the example's model: three Linear layers, a weight and a bias each
    assert "6 model" in out


def test_lone_file_example_is_inspected(ckptfs_bin):
    run = subprocess.run([str(ckptfs_bin), "inspect", str(REPO / "examples" / "torch-save-file" / "full_state.pt")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "format:     torch.save file" in run.stdout
    assert "6 model" in run.stdout  # the DCP example's model, through its 'model' subtree
    assert (REPO / "examples" / "torch-save-file" / "full_state.pt").read_bytes() == \
        (REPO / "mount_tests" / "fixtures" / "dcp-real" / "shard1_ws2" / "golden.pt").read_bytes()


def test_dcp_example_is_torchs_output():
    example = REPO / "examples" / "dcp-shard1-ws2"
    original = REPO / "mount_tests" / "fixtures" / "dcp-real" / "shard1_ws2" / "checkpoint"
    names = sorted(p.name for p in example.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name in names:
        assert (example / name).read_bytes() == (original / name).read_bytes(), name


def test_universal_example_is_deepspeeds_output():
    """examples/deepspeed-universal-z2-bf16 is DeepSpeed's own ds_to_universal output, byte for byte."""
    example = REPO / "examples" / "deepspeed-universal-z2-bf16"
    original = REPO / "mount_tests" / "fixtures" / "deepspeed-real" / "z2_bf16_ws2" / "checkpoint" / \
        "global_step3_universal"
    names = sorted(p.relative_to(example) for p in example.rglob("*") if p.is_file())
    assert names and names == sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    for name in names:
        assert (example / name).read_bytes() == (original / name).read_bytes(), name


def test_example_is_the_generated_case(fixtures_dir):
    """The expectation above holds only while the example equals the generator's output (regenerate it
    with the command in examples/README.md when the generator changes)."""
    example = REPO / "examples" / "deepspeed-zero3-bf16"
    generated = Path(fixtures_dir) / "z3_bf16_dp2" / "checkpoint"
    names = sorted(p.relative_to(example) for p in example.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(generated) for p in generated.rglob("*") if p.is_file())
    for name in names:
        assert (example / name).read_bytes() == (generated / name).read_bytes(), name
