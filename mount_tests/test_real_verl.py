"""ckptfs against checkpoints written by real verl (mount_tests/fixtures/verl-real: FSDPCheckpointManager of
verl b178a3cd, torch 2.14.1; fsdp2_fp32_ws2 with FSDP2 fully_shard, steps 1 and 2; fsdp1_fp32_ws2 with FSDP1,
use_orig_params=True, step 2) and what verl's own merger makes of them:

- model.safetensors: byte for byte the file `python -m verl.model_merger merge --backend fsdp` wrote
  (golden*.manifest.json + golden*.bin: its tensors in data order, bf16), the header rebuilt here by the
  safetensors writer's rules (__metadata__ {"format": "pt"}, compact JSON, spaces to a multiple of 8);
- fp32/model.safetensors and fp32/pytorch_model.bin: the live model's fp32 state dict (golden*.native.*);
- config.json: the merger's (golden*.config.json: the saved one with dtype bfloat16), generation_config.json
  and the tokenizer files: huggingface/'s, unchanged.

Each checkpoint is given to ckptfs as the save dir (the tracker's step at the mount root, every step under
tags/), with --tag, as a global_step_N dir and as its actor/ dir, through `ckptfs export` and a FUSE mount.
"""
import filecmp
import json
import os
import struct

import pytest
import torch

import helpers as H
from mounting import mounted

REAL_DIR = os.path.join(H.HERE, "fixtures", "verl-real")
# case -> (wrapper, steps, the tracker's step)
CASES = {"fsdp2_fp32_ws2": (2, ["global_step_1", "global_step_2"], "global_step_2"),
         "fsdp1_fp32_ws2": (1, ["global_step_2"], "global_step_2")}
HF_FILES = ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]
ST_NAMES = {"bfloat16": "BF16", "float32": "F32"}


def case_path(name, *parts):
    return os.path.join(REAL_DIR, name, *parts)


def golden_prefix(name, step):
    """The tracker's step has golden.*, an older step golden_<step>.*"""
    return "golden" if step == CASES[name][2] else f"golden_{step}"


def load_json(path):
    with open(path) as f:
        return json.load(f)


def expected_safetensors(manifest_path, bin_path):
    """The bytes safetensors' save_file writes for the manifest's tensors (listed in data order)."""
    manifest = load_json(manifest_path)
    with open(bin_path, "rb") as f:
        data = f.read()
    header = {"__metadata__": {"format": "pt"}}
    pos = 0
    for k, m in manifest.items():
        assert m["offset"] == pos, f"{manifest_path}: {k} not in data order"
        header[k] = {"dtype": ST_NAMES[m["dtype"]], "shape": m["shape"], "data_offsets": [pos, pos + m["nbytes"]]}
        pos += m["nbytes"]
    assert pos == len(data), f"{bin_path}: {len(data)} bytes, manifest covers {pos}"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data, manifest


def check_safetensors_file(path, manifest_path, bin_path, what):
    want, manifest = expected_safetensors(manifest_path, bin_path)
    ours = H.read_safetensors(path)
    assert list(ours) == list(manifest), f"{what}: tensor order {list(ours)}, the merger's {list(manifest)}"
    for k, m in manifest.items():
        assert str(ours[k].dtype) == f"torch.{m['dtype']}" and list(ours[k].shape) == m["shape"], \
            f"{what} {k}: {ours[k].dtype} {list(ours[k].shape)}, golden {m['dtype']} {m['shape']}"
        assert H.sha256_le(ours[k]) == m["sha256"], f"{what} {k}: bytes differ from the golden sha256"
    with open(path, "rb") as f:
        got = f.read()
    assert got == want, f"{what}: not byte-identical to the golden file ({len(got)} vs {len(want)} bytes)"
    return ours


def check_views(d, name, step, what):
    g = case_path(name, golden_prefix(name, step))
    check_safetensors_file(os.path.join(d, "model.safetensors"), g + ".manifest.json", g + ".bin",
                           f"{what} model.safetensors")
    native = check_safetensors_file(os.path.join(d, "fp32", "model.safetensors"), g + ".native.manifest.json",
                                    g + ".native.bin", f"{what} fp32/model.safetensors")
    b = torch.load(os.path.join(d, "fp32", "pytorch_model.bin"), map_location="cpu", weights_only=True)
    H.assert_state_equal(b, native, ordered=False, what=f"{what} fp32/pytorch_model.bin vs the live fp32 state dict")
    assert filecmp.cmp(os.path.join(d, "config.json"), g + ".config.json", shallow=False), \
        f"{what} config.json differs from the merger's"
    assert filecmp.cmp(os.path.join(d, "generation_config.json"), g + ".generation_config.json", shallow=False)
    hf = case_path(name, "checkpoint", step, "actor", "huggingface")
    for f in HF_FILES:
        assert filecmp.cmp(os.path.join(d, f), os.path.join(hf, f), shallow=False), f"{what} {f} differs from {hf}"
    views = sorted(os.path.relpath(os.path.join(dp, f), d) for dp, _, fs in os.walk(d) for f in fs
                   if not os.path.relpath(dp, d).startswith("tags") and f != "ckptfs.json")
    assert views == sorted(["config.json", "fp32/model.safetensors", "fp32/pytorch_model.bin", "model.safetensors",
                            *HF_FILES]), f"{what}: views {views}"


def sources(name):
    """(label, SRC, --tag, the step it shows) for every way of giving ckptfs a step of this checkpoint."""
    save = case_path(name, "checkpoint")
    _, steps, latest = CASES[name]
    out = [("save dir", save, None, latest)]
    for s in steps:
        out += [(f"save dir --tag {s}", save, s, s), (f"{s} dir", os.path.join(save, s), None, s),
                (f"{s}/actor dir", os.path.join(save, s, "actor"), None, s)]
    return out


def test_real_fixtures_present():
    for name, (_, steps, latest) in CASES.items():
        with open(case_path(name, "checkpoint", "latest_checkpointed_iteration.txt")) as f:
            assert f"global_step_{f.read()}" == latest
        for s in steps:
            g = golden_prefix(name, s)
            for f in (".manifest.json", ".bin", ".native.manifest.json", ".native.bin", ".config.json"):
                assert os.path.isfile(case_path(name, g + f)), f"missing {name}/{g}{f}"


@pytest.mark.parametrize("name", CASES)
def test_export_matches_verl_merger(export_cache, name):
    for label, src, tag, step in sources(name):
        proc, out = export_cache(src, tag)
        H.assert_ok(proc)
        check_views(str(out), name, step, f"{name} export ({label})")


@pytest.mark.parametrize("name", CASES)
def test_mount_matches_verl_merger(ckptfs_bin, tmp_path, name):
    _, steps, latest = CASES[name]
    with mounted(ckptfs_bin, case_path(name, "checkpoint"), tmp_path / "mnt") as mnt:
        assert sorted(os.listdir(os.path.join(mnt, "tags"))) == steps
        info = load_json(os.path.join(mnt, "ckptfs.json"))
        assert (info["framework"], info["root_tag"]) == ("verl", latest), info
        check_views(mnt, name, latest, f"{name} mount root")
        for s in steps:
            check_views(os.path.join(mnt, "tags", s), name, s, f"{name} mount tags/{s}")
    with mounted(ckptfs_bin, case_path(name, "checkpoint", latest, "actor"), tmp_path / "mnt2") as mnt:
        check_views(mnt, name, latest, f"{name} mount of {latest}/actor")


@pytest.mark.parametrize("name", CASES)
def test_inspect_says_verl(ckptfs_bin, name):
    version, steps, latest = CASES[name]
    proc = H.run([ckptfs_bin, "inspect", case_path(name, "checkpoint"), "--json"])
    H.assert_ok(proc)
    info = json.loads(proc.stdout)
    assert info["framework"] == "verl" and [t["name"] for t in info["tags"]] == steps, info
    for t in info["tags"]:
        assert f"FSDP{version}" in t["format"] and t["topology"]["dp"] == 2, t
        assert any("world size 2, mesh fsdp=2" in n for n in t["notes"]), t["notes"]
    text = H.run([ckptfs_bin, "inspect", case_path(name, "checkpoint")])
    H.assert_ok(text)
    assert "framework:  verl" in text.stdout and f"(latest: {latest})" in text.stdout, text.stdout


def test_a_tracker_without_megatron_layout_is_not_megatron(ckptfs_bin, tmp_path):
    """latest_checkpointed_iteration.txt is verl's and Megatron-LM's: alone it makes no Megatron save (exit 3,
    no checkpoint found), beside an iter_* dir it still does (Megatron's own message)."""
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    proc = H.run([ckptfs_bin, "inspect", tmp_path])
    H.assert_one_line_error(proc, H.EXIT_SOURCE, ["no checkpoint found"])
    assert "Megatron-LM iteration dir" not in proc.stderr, proc.stderr
    (tmp_path / "iter_0000002").mkdir()
    H.assert_one_line_error(H.run([ckptfs_bin, "inspect", tmp_path]), H.EXIT_SOURCE, ["no Megatron-LM iteration dir"])
