"""The HuggingFaceStorageWriter cases (torch 2.14, the sid chroot), shared by generate_hf_storage.py (in the
chroot) and mount_tests/test_dcp_hf_storage.py (host).  Standard library only.
"""

GEN_VERSION = 3  # bump to invalidate cached fixtures (build/fixtures-dcp-hf)

# name -> (world size, the layout of checkpoint/ in docs/formats/dcp.md's words, as `ckptfs inspect` names it)
CASES = {
    "hf_distributed_ws2": (2, "distributed shards (save_distributed=True)"),
    "hf_consolidated_ws2": (2, "consolidated (consolidate_safetensors_files; sharded/ not read)"),
    "hf_full_rank0_ws2": (2, "full tensors (rank-0 save)"),
    # torchtitan with last_save_in_hf: checkpoint/step-10/ a DCP dir, checkpoint/step-20/ consolidated HF storage
    "hf_torchtitan_like_ws2": (2, "step_dirs"),
}
LAYOUT_CASES = [n for n, (_, layout) in CASES.items() if layout != "step_dirs"]  # checkpoint/ is one HF dir
