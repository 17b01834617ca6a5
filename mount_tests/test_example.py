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


def test_example_is_the_generated_case(fixtures_dir):
    """The expectation above holds only while the example equals the generator's output (regenerate it
    with the command in examples/README.md when the generator changes)."""
    example = REPO / "examples" / "deepspeed-zero3-bf16"
    generated = Path(fixtures_dir) / "z3_bf16_dp2" / "checkpoint"
    names = sorted(p.relative_to(example) for p in example.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(generated) for p in generated.rglob("*") if p.is_file())
    for name in names:
        assert (example / name).read_bytes() == (generated / name).read_bytes(), name
