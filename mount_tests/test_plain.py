"""A lone weights file as SRC: a torch.save file (plain state dict, or a nested training state with a
'model' entry) or a .safetensors file, exported and mounted, compared with what torch itself loads."""
import os
import sys

import pytest
import torch

import helpers as H
from mounting import mounted

CASE = "z2_bf16_dp2"


def saved(tmp_path, name, obj):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def upcast(sd):
    return {k: v.float() if v.dtype in (torch.float16, torch.bfloat16) else v for k, v in sd.items()}


def check(out, model, ordered=True):
    H.assert_state_equal(H.read_safetensors(out / "model.safetensors"), model, ordered=False, what="model.safetensors")
    H.assert_state_equal(torch.load(out / "fp32" / "pytorch_model.bin", weights_only=True), upcast(model),
                         ordered=ordered, what="fp32/pytorch_model.bin")
    H.assert_state_equal(H.read_safetensors(out / "fp32" / "model.safetensors"), upcast(model), ordered=False,
                         what="fp32/model.safetensors")


def test_state_dict_file(fixtures_dir, ckptfs_bin, tmp_path):
    model = torch.load(os.path.join(fixtures_dir, CASE, "expected", "model.pt"), weights_only=True)
    src = saved(tmp_path, "pytorch_model.bin", model)
    H.assert_ok(H.run([ckptfs_bin, "export", src, tmp_path / "out"]))
    check(tmp_path / "out", model)
    with mounted(ckptfs_bin, src, tmp_path / "mnt") as mnt:
        check(tmp_path / "mnt", model)
        assert sorted(os.listdir(mnt)) == ["ckptfs.json", "fp32", "model.safetensors", "tags"]


def test_nested_training_state_serves_its_model_subtree(fixtures_dir, ckptfs_bin, tmp_path):
    model = torch.load(os.path.join(fixtures_dir, CASE, "expected", "model.pt"), weights_only=True)
    state = {"model": model, "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"lr": 0.1}]},
             "step": 7}
    src = saved(tmp_path, "full.pt", state)
    H.assert_ok(H.run([ckptfs_bin, "export", src, tmp_path / "out"]))
    check(tmp_path / "out", model)


def test_safetensors_file(fixtures_dir, ckptfs_bin, tmp_path, export_cache):
    proc, out = export_cache(os.path.join(fixtures_dir, CASE, "checkpoint"))
    H.assert_ok(proc)
    model = torch.load(os.path.join(fixtures_dir, CASE, "expected", "model.pt"), weights_only=True)
    H.assert_ok(H.run([ckptfs_bin, "export", out / "model.safetensors", tmp_path / "again"]))
    check(tmp_path / "again", model, ordered=False)  # a safetensors file holds its tensors by dtype width
    # the same bytes back: a safetensors file served as model.safetensors is laid out the same way
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


@pytest.mark.parametrize("content, code", [(b"not a checkpoint at all", H.EXIT_INVALID),
                                           (b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}", H.EXIT_INVALID)])
def test_bad_lone_files(ckptfs_bin, tmp_path, content, code):
    for name in ("x.pt", "x.safetensors"):
        path = tmp_path / name
        path.write_bytes(content)
        H.assert_one_line_error(H.run([ckptfs_bin, "inspect", path]), code, [name])
