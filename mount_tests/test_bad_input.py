"""Broken checkpoints: ckptfs must exit with the documented code and a ONE-line message naming the broken
file, never crash (signal) or print a traceback.  Exit codes: 2 usage, 3 source unreadable / no
checkpoint, 4 invalid checkpoint, 5 unsupported, 7 output failed."""
import os
import shutil
import struct
import zipfile

import pytest
import torch

import helpers as H

TAG = "global_step3"
# (case, its DP-4 variant, optimizer file prefix, model-states file of rank 0)
BASES = {
    "z2": ("z2_fp16_dp2", "z2_fp16_dp4", "", "mp_rank_00_model_states.pt"),
    "z3": ("z3_bf16_dp2", "z3_bf16_dp4", "bf16_", "zero_pp_rank_0_mp_rank_00_model_states.pt"),
}


def optim_name(prefix, rank):
    return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def export(ckptfs_bin, src, tmp_path):
    return H.run([ckptfs_bin, "export", src, tmp_path / "out"])


def zip_member_data_range(path, suffix):
    """(offset, size) of the stored data of the zip member whose name ends with ``suffix`` (sizes from the
    central directory: torch's writer leaves them 0 in the local header and uses a data descriptor)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    assert info.compress_type == zipfile.ZIP_STORED, "torch.save stores members uncompressed"
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
    assert local[:4] == b"PK\x03\x04"
    nlen, xlen = struct.unpack_from("<HH", local, 26)
    return info.header_offset + 30 + nlen + xlen, info.compress_size


@pytest.fixture(params=sorted(BASES))
def base(request):
    return BASES[request.param]


def test_truncated_zip(ckptfs_bin, case_copy, tmp_path, base):
    case, _, prefix, _ = base
    src = case_copy(case)
    victim = src / TAG / optim_name(prefix, 1)
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, [victim.name])


def test_garbage_pickle(ckptfs_bin, case_copy, tmp_path, base):
    case, _, prefix, _ = base
    src = case_copy(case)
    victim = src / TAG / optim_name(prefix, 0)
    off, n = zip_member_data_range(victim, "/data.pkl")
    junk = bytes([0x80, 0x02]) + bytes((i * 151 + 7) % 256 for i in range(n - 2))
    with open(victim, "r+b") as f:
        f.seek(off)
        f.write(junk)
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, [victim.name])


def test_missing_rank_file(ckptfs_bin, case_copy, tmp_path, base):
    case, _, prefix, _ = base
    src = case_copy(case)
    victim = src / TAG / optim_name(prefix, 1)
    victim.unlink()
    # the message names the missing file (or, failing a name, the tag folder it is missing from)
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, [victim.name, TAG])


def _resave(path, edit):
    sd = torch.load(path, map_location="cpu", weights_only=False)
    edit(sd)
    torch.save(sd, path)


def test_partition_count_mismatch(ckptfs_bin, case_copy, tmp_path, base):
    case, _, prefix, _ = base
    src = case_copy(case)
    victim = src / TAG / optim_name(prefix, 0)

    def edit(sd):
        osd = sd["optimizer_state_dict"]
        pc = osd["partition_count"]
        osd["partition_count"] = [3 for _ in pc] if isinstance(pc, list) else 3
    _resave(victim, edit)
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, [victim.name])


def test_optimizer_file_from_other_world_size(ckptfs_bin, case_copy, fixtures_dir, tmp_path, base):
    case, other, prefix, _ = base
    src = case_copy(case)
    victim = src / TAG / optim_name(prefix, 1)
    shutil.copyfile(os.path.join(fixtures_dir, other, "checkpoint", TAG, victim.name), victim)
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, [victim.name])


def test_param_shape_does_not_add_up(ckptfs_bin, case_copy, tmp_path, base):
    case, _, prefix, model_file = base
    src = case_copy(case)
    victim = src / TAG / model_file

    def edit(sd):
        for group in sd["param_shapes"]:
            if "embed.weight" in group:
                rows, cols = group["embed.weight"]
                group["embed.weight"] = torch.Size([rows + 3, cols])
                return
        raise AssertionError("embed.weight not in param_shapes")
    _resave(victim, edit)
    # the inconsistency is between the model states and the optimizer partitions: either may be named
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, [victim.name, "optim_states.pt"])


def test_nonexistent_source(ckptfs_bin, tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    H.assert_one_line_error(export(ckptfs_bin, missing, tmp_path), H.EXIT_SOURCE, ["no_such_checkpoint"])


def test_empty_folder_is_not_a_checkpoint(ckptfs_bin, tmp_path):
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    H.assert_one_line_error(export(ckptfs_bin, empty, tmp_path), H.EXIT_SOURCE, ["empty_dir"])


@pytest.mark.parametrize("args", [
    ["export"],
    ["export", "only_one_arg"],
    ["export", "a", "b", "c"],
    ["export", "--no-such-option", "a", "b"],
    ["inspect"],
    ["inspect", "--bogus", "x"],
    ["export", "a", "b", "--tag"],
], ids=lambda a: " ".join(a) or "none")
def test_bad_usage(ckptfs_bin, args):
    proc = H.run([ckptfs_bin, *args])
    assert proc.returncode == H.EXIT_USAGE, H.describe(proc)
    assert "Traceback" not in proc.stderr


def test_tensor_parallel_ranks_without_split_rules_are_unsupported(ckptfs_bin, case_copy, tmp_path):
    """Several mp_rank files without pipeline layer files and without universal_checkpoint_info: TP slices
    whose merge rule nothing records."""
    src = case_copy("z2_fp16_dp2")
    shutil.copy(src / TAG / "mp_rank_00_model_states.pt", src / TAG / "mp_rank_01_model_states.pt")
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_UNSUPPORTED,
                            ["mp_rank_00_model_states.pt", "universal_checkpoint_info"])


def test_moe_expert_file_without_expert_keys_is_invalid(ckptfs_bin, case_copy, tmp_path):
    src = case_copy("z2_fp16_dp2")
    shutil.copy(src / TAG / "mp_rank_00_model_states.pt",
                src / TAG / "layer_0_expert_0_mp_rank_00_model_states.pt")
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID,
                            ["layer_0_expert_0_mp_rank_00_model_states.pt"])


def test_legacy_moe_expert_files_are_unsupported(ckptfs_bin, case_copy, tmp_path):
    """expert_<id>_mp_rank_00 files (no layer id: the old MoE layout DeepSpeed loads with old_moe_load) are not merged."""
    src = case_copy("z2_fp16_dp2")
    shutil.copy(src / TAG / "mp_rank_00_model_states.pt", src / TAG / "expert_0_mp_rank_00_model_states.pt")
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_UNSUPPORTED,
                            ["expert_0_mp_rank_00_model_states.pt", "not supported yet"])


def test_output_inside_source_is_refused(ckptfs_bin, case_copy):
    src = case_copy("z2_fp16_dp2")
    before = sorted(p.name for p in src.rglob("*"))
    H.assert_one_line_error(H.run([ckptfs_bin, "export", src, src / "merged"]), H.EXIT_USAGE, ["merged"])
    assert sorted(p.name for p in src.rglob("*")) == before


def rewrite_model_states(src, edit):
    """Loads the ZeRO-0 model-state file of ``src`` (the generator's: it holds a set, which torch 1.13's
    weights_only refuses), applies ``edit`` to it and saves it back (storage sharing kept)."""
    path = src / TAG / "mp_rank_00_model_states.pt"
    sd = torch.load(path, map_location="cpu", weights_only=False)
    edit(sd)
    torch.save(sd, path)
    return path


def test_unfused_masters_ambiguous_with_a_frozen_twin(ckptfs_bin, case_copy, tmp_path):
    """ZeRO-0 FP16_UnfusedOptimizer names no master: a frozen param right before a trainable one of the same
    shape could own either master, so ckptfs refuses rather than guess."""
    def add_twin(sd):
        module = sd["module"]
        items = list(module.items())
        i = next(j for j, (k, _) in enumerate(items) if k == "blocks.0.ln.weight")
        items.insert(i, ("blocks.0.ln.frozen_scale", items[i][1].clone()))
        module.clear()
        module.update(items)
    victim = rewrite_model_states(case_copy("z0_bf16_unfused_dp2"), add_twin)
    H.assert_one_line_error(export(ckptfs_bin, victim.parent.parent, tmp_path), H.EXIT_UNSUPPORTED, [victim.name])


def test_unfused_masters_out_of_module_order(ckptfs_bin, case_copy, tmp_path):
    """Param groups whose params are not in module order cannot be matched to their masters: an error naming
    the file, not fp32 tensors under the wrong names."""
    def reverse_group(sd):
        sd["optimizer"]["fp32_groups"][0].reverse()
    victim = rewrite_model_states(case_copy("z0_bf16_unfused_dp2"), reverse_group)
    H.assert_one_line_error(export(ckptfs_bin, victim.parent.parent, tmp_path), H.EXIT_INVALID, [victim.name])


def test_tensor_parallel_universal_file_of_the_wrong_shape(ckptfs_bin, tmp_path):
    """A TP universal tree (DeepSpeed's own, AutoTP) whose fp32.pt does not hold the param merged over the
    TP ranks (here one rank's slice) is an error naming that file, not a mis-shaped master."""
    from conftest import REAL_019_DIR
    src = tmp_path / "checkpoint"
    shutil.copytree(os.path.join(REAL_019_DIR, "autotp2_z1_bf16_ws2", "checkpoint"), src)
    victim = src / f"{TAG}_universal" / "zero" / "model.layers.0.self_attn.q_proj.weight" / "fp32.pt"
    victim.chmod(0o644)
    obj = torch.load(victim, map_location="cpu", weights_only=True)
    torch.save({"cat_dim": 0, "param": obj["param"][: obj["param"].shape[0] // 2].clone()}, victim)
    proc = H.run([ckptfs_bin, "export", src, tmp_path / "out", "--tag", f"{TAG}_universal"])
    H.assert_one_line_error(proc, H.EXIT_INVALID, ["q_proj.weight/fp32.pt"])


def test_fused_masters_without_flat_buffer_views(ckptfs_bin, case_copy, tmp_path):
    """FP16_Optimizer's masters are placed by the module params' offsets in their flat 16-bit buffer: params
    that own their storage (not DeepSpeed's layout) are an error naming the file, not guessed offsets."""
    def own_storage(sd):
        for k, v in sd["module"].items():
            sd["module"][k] = v.clone()
    victim = rewrite_model_states(case_copy("z0_fp16_dp2"), own_storage)
    H.assert_one_line_error(export(ckptfs_bin, victim.parent.parent, tmp_path), H.EXIT_INVALID, [victim.name])


def test_accelerate_local_folder_with_a_damaged_model_file_is_refused_not_served_as_its_optimizer(ckptfs_bin,
                                                                                                  tmp_path):
    """accelerate's save_state under FSDP's LOCAL_STATE_DICT (mount_tests/fixtures/fsdp-local-real, written by
    accelerate 1.14 on torch 2.14): the model as per-rank flat-parameter files beside optimizer_0/, a DCP dir of
    the optimizer's state alone. With a model file cut short the folder is refused (exit 4, naming that file),
    never mounted as that DCP dir with an empty model.safetensors."""
    src = tmp_path / "checkpoint"
    shutil.copytree(os.path.join(H.REPO, "mount_tests", "fixtures", "fsdp-local-real",
                                 "accelerate_llama_ws2_fp32_orig", "checkpoint"), src)
    victim = src / "pytorch_model_fsdp_rank1.bin"
    victim.chmod(0o644)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    H.assert_one_line_error(export(ckptfs_bin, src, tmp_path), H.EXIT_INVALID, ["pytorch_model_fsdp_rank1.bin"])
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = H.run([ckptfs_bin, src, mnt, "-o", "index_cache=off"])
    H.assert_one_line_error(proc, H.EXIT_INVALID, ["pytorch_model_fsdp_rank1.bin"])
    assert not os.path.ismount(mnt)
