"""README's first command: examples/run.sh mounts the bundled example and loads the merged weights; the
other bundled examples are inspected by it, and each is the output of the tool that wrote it."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import helpers as H
import test_megatron as TM
import test_verl as TV
from mounting import mounted
from test_verl import verl_fixtures  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parent.parent
MEGATRON_EXAMPLE = REPO / "examples" / "megatron-tp2-pp2"
MEGATRON_CASE = "legacy_tp2_pp2_llama"  # the generator case the Megatron example was copied from
VERL_EXAMPLE = REPO / "examples" / "verl-fsdp2-ws2"
VERL_CASE = "fsdp2_ws2_example"  # the verl generator case it was copied from


@pytest.fixture(scope="module")
def run_sh_output(ckptfs_bin):
    """stdout of examples/run.sh against the binary under test (run once for the module)."""
    env = dict(os.environ, CKPTFS_BIN=str(ckptfs_bin))
    run = subprocess.run(["bash", str(REPO / "examples" / "run.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture(scope="module")
def megatron_case():
    """(fixtures root, case.json) of the Megatron generator case the example was copied from."""
    root = TM._fixtures_root()
    H.assert_ok(H.run([sys.executable, TM.GENERATOR, root, "--only", MEGATRON_CASE], timeout=TM.GEN_TIMEOUT))
    return root, TM.info_of(root, MEGATRON_CASE)


def assert_same_files(example, original):
    """Every file below `example` is the file at the same path below `original`, byte for byte, and
    nothing is missing."""
    names = sorted(p.relative_to(example) for p in example.rglob("*") if p.is_file())
    assert names and names == sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    for name in names:
        assert (example / name).read_bytes() == (original / name).read_bytes(), name


def test_example_script_mounts_lists_and_loads(run_sh_output, fixtures_dir):
    out = run_sh_output
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


def test_dcp_example_is_inspected(run_sh_output):
    out = run_sh_output[run_sh_output.index("$ ckptfs inspect examples/dcp-shard1-ws2"):]
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
    assert_same_files(example, original)


def test_example_is_the_generated_case(fixtures_dir):
    """The expectation above holds only while the example equals the generator's output (regenerate it
    with the command in examples/README.md when the generator changes)."""
    assert_same_files(REPO / "examples" / "deepspeed-zero3-bf16", Path(fixtures_dir) / "z3_bf16_dp2" / "checkpoint")


def test_megatron_example_is_inspected(run_sh_output):
    out = run_sh_output[run_sh_output.index("$ ckptfs inspect examples/megatron-tp2-pp2"):]
    assert "format:     Megatron-LM checkpoint (legacy torch format)" in out
    assert re.search(r"^\s+topology:.*\bTP 2, PP 2$", out, re.M), out
    assert "tags:       iter_0000003 (latest: iter_0000003)" in out
    for view in ("model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors", "hf/model.safetensors",
                 "hf/config.json"):
        assert re.search(rf"^\s+{re.escape(view)}\s+\d+ bytes", out, re.M), view


def test_megatron_example_mounts(ckptfs_bin, megatron_case, tmp_path):
    """The mounted example's model.safetensors, fp32/ and hf/ (tensors and config.json) are the generator's
    expectations, computed from its own model, not by ckptfs."""
    root, info = megatron_case
    with mounted(ckptfs_bin, MEGATRON_EXAMPLE, tmp_path / "mnt") as mnt:
        TM.check_views(mnt, root, info, info["latest"], "examples/megatron-tp2-pp2: ")
        hf = H.read_safetensors(os.path.join(mnt, "hf", "model.safetensors"))
    # and one tensor straight from the rank files: the embedding's vocab-parallel halves on stage 0 of
    # TP ranks 0 and 1, joined along rows, the padding to 256 rows cut back to the true vocab of 250
    halves = [torch.load(MEGATRON_EXAMPLE / "iter_0000003" / f"mp_rank_0{tp}_000" / "model_optim_rng.pt",
                         map_location="cpu")["model"]["language_model"]["embedding"]["word_embeddings"]["weight"]
              for tp in (0, 1)]
    H.assert_tensor_equal("model.embed_tokens.weight", hf["model.embed_tokens.weight"], torch.cat(halves)[:250])


def test_megatron_example_is_the_generated_case(megatron_case):
    """check_views above holds only while the example equals the generator's output (regenerate it with the
    command in examples/README.md when the generator changes)."""
    root, info = megatron_case
    assert_same_files(MEGATRON_EXAMPLE, Path(root) / MEGATRON_CASE / info["src"])


def test_verl_example_is_inspected(run_sh_output):
    out = run_sh_output[run_sh_output.index("$ ckptfs inspect examples/verl-fsdp2-ws2"):]
    assert "framework:  verl" in out and "tags:       global_step_1, global_step_2 (latest: global_step_2)" in out
    assert "format:     verl FSDP2 checkpoint (FSDPCheckpointManager), roles actor" in out
    assert "note: actor: FSDP2, world size 2, mesh fsdp=2" in out
    for view in ("model.safetensors", "fp32/pytorch_model.bin", "fp32/model.safetensors", "config.json"):
        assert re.search(rf"^\s+{re.escape(view)}\s+\d+ bytes", out, re.M), view


def test_verl_example_mounts_as_the_generated_case(ckptfs_bin, verl_fixtures, tmp_path):
    """The example holds the generator's case's files (the same names; torch.save's random serialization ids
    aside, the same tensors): mounted, every step's views are that case's expectations."""
    root = TV.fixtures(verl_fixtures)
    original = Path(root) / VERL_CASE / "checkpoint"
    names = sorted(p.relative_to(VERL_EXAMPLE) for p in VERL_EXAMPLE.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    info = TV.info_of(root, VERL_CASE)
    with mounted(ckptfs_bin, VERL_EXAMPLE, tmp_path / "mnt") as mnt:
        for step in info["steps"]:
            TV.check_step(os.path.join(mnt, "tags", step), root, VERL_CASE, step, f"examples/verl-fsdp2-ws2 {step}")


@pytest.mark.parametrize("example, fixture, says, view", [
    ("deepspeed-moe-ep2", "deepspeed-0.19-real/moe_ep2_z2_bf16_ws2", "topology:   ZeRO-2, DP 2, TP 1, PP 1, EP 2 (2 experts)",
     "fp32/pytorch_model.bin"),
    ("dcp-hf-storage-ws2", "dcp-2.14-real/hf_sharded_ws2",
     "Hugging Face storage (HuggingFaceStorageWriter): distributed shards", "fp32/pytorch_model.bin"),
    ("fsdp-local-llama-ws2", "fsdp-local-real/fsdp1_llama_ws2_fp32_flat",
     "format:     FSDP per-rank save: rank{R}.pt (FSDP1 LOCAL_STATE_DICT flat parameters, 2 ranks)",
     "fp32/pytorch_model.bin"),
    # an import saves no optimizer state: no fp32/, the hf/ Qwen3-MoE view instead
    ("megatron-bridge-qwen3moe-ep2", "megatron-2026-real/shared_bridge_qwen3moe_import_ep2",
     "format:     Megatron-Bridge checkpoint (torch_dist; model config: run_config.yaml's model section)",
     "hf/model.safetensors"),
])
def test_real_example_is_inspected_and_the_frameworks_output(run_sh_output, example, fixture, says, view):
    """The MoE, HF storage, FSDP per-rank and Megatron-Bridge examples are the real fixtures' checkpoints
    (DeepSpeed 0.19.5, torch 2.14, Megatron-Bridge 067f987)."""
    out = run_sh_output[run_sh_output.index(f"$ ckptfs inspect examples/{example}"):]
    assert says in out
    assert re.search(rf"^\s+{re.escape(view)}\s+\d+ bytes", out, re.M)
    assert_same_files(REPO / "examples" / example, REPO / "mount_tests" / "fixtures" / fixture / "checkpoint")


def safetensors_data_bytes(path):
    """The size of a safetensors file's data section, from its own header (8-byte length, JSON)."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    return os.path.getsize(path) - 8 - header_len


def test_inspect_reads_is_each_safetensors_view_data_once(ckptfs_bin, tmp_path):
    """inspect --json's `reads` of a view whose tensors need no conversion (the Megatron example's bf16
    model and fp32 masters, replicated TP parameters read from one rank) is its data section: every source
    byte it serves, read once."""
    proc = H.run([ckptfs_bin, "inspect", "--json", MEGATRON_EXAMPLE])
    H.assert_ok(proc)
    views = {v["path"]: v for v in json.loads(proc.stdout)["tags"][0]["views"]}
    with mounted(ckptfs_bin, MEGATRON_EXAMPLE, tmp_path / "mnt") as mnt:
        for path in ("model.safetensors", "fp32/model.safetensors"):
            assert views[path]["reads"] == safetensors_data_bytes(os.path.join(mnt, path)), (path, views[path])
