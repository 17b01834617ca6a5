"""A lone weights file as SRC: a torch.save file (plain state dict, or a nested training state with a
'model' entry) or a .safetensors file, exported and mounted, compared with what torch itself loads."""
import json
import os
import struct

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


ST_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
            torch.bool: "BOOL"}


def write_safetensors(path, tensors):
    """A safetensors file written here from the format's rules (8-byte header length, JSON header, data
    in the given order), independent of ckptfs."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_safetensors_file(fixtures_dir, ckptfs_bin, tmp_path):
    model = torch.load(os.path.join(fixtures_dir, CASE, "expected", "model.pt"), weights_only=True)
    src = tmp_path / "model.safetensors"
    write_safetensors(src, model)
    H.assert_ok(H.run([ckptfs_bin, "export", src, tmp_path / "out"]))
    check(tmp_path / "out", model)  # the file's tensor order is model.pt's order here


@pytest.mark.parametrize("content, code", [(b"not a checkpoint at all", H.EXIT_INVALID),
                                           (b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}", H.EXIT_INVALID)])
def test_bad_lone_files(ckptfs_bin, tmp_path, content, code):
    for name in ("x.pt", "x.safetensors"):
        path = tmp_path / name
        path.write_bytes(content)
        H.assert_one_line_error(H.run([ckptfs_bin, "inspect", path]), code, [name])
