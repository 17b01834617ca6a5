"""The DCP fixture cases, shared by generate_dcp.py (runs in the torch 2.6 chroot), run_generator.py and
mount_tests/test_dcp.py (host).  Standard library only: the tests parametrize over these names before
anything is generated.
"""

GEN_VERSION = 1  # bump to invalidate cached fixtures (build/fixtures-dcp)

# name -> world size, layout of checkpoint/ ("dcp_dir": checkpoint/ is one DCP dir; "dcp_folder": a folder
# of DCP dirs (accelerate); "step_dirs": a folder of step dirs, each a DCP dir or a folder of them)
CASES = {
    "dtensor_shard0_fp32_ws2": (2, "dcp_dir"),
    "dtensor_shard0_bf16_ws2": (2, "dcp_dir"),
    "dtensor_shard1_ws2": (2, "dcp_dir"),
    "mesh2d_ws4": (4, "dcp_dir"),
    "fsdp2_bf16_ws2": (2, "dcp_dir"),
    "torchtitan_like_ws2": (2, "step_dirs"),
    "hf_trainer_like_ws2": (2, "step_dirs"),
    "nontensor_items_ws2": (2, "dcp_dir"),
    "one_file_per_item_ws2": (2, "dcp_dir"),
    "replicated_dedup_ws2": (2, "dcp_dir"),
    "async_save_ws2": (2, "dcp_dir"),
    "bad_inputs_ws2": (2, "bad"),
}

GOOD_CASES = [n for n, (_, layout) in CASES.items() if layout != "bad"]

# The torch 2.14 layouts, written by generate_dcp214.py in the Debian unstable chroot (2 ranks, each
# checkpoint/ one DCP dir); their expected result is the state saved, each DTensor as its full tensor.
GEN_VERSION_214 = 1
CASES_214 = ["safetensors_format_ws2", "dtypes_zstd_nocoll_ws2"]

# Broken variants written by the generator into bad_inputs_ws2/checkpoint/<variant>/ (each a whole DCP dir,
# .metadata edited with pickle in the chroot): variant -> (allowed exit codes, names the one-line message
# may cite).  4 = invalid checkpoint, 5 = unsupported (docs/exit-codes.md).
BAD_VARIANTS = {
    # _StorageInfo.length of one chunk runs past the end of its .distcp file
    "item_outside_file": ((4,), ["__1_0.distcp", ".metadata", "fc1.weight"]),
    # an extra chunk that overlaps chunk 0 (its own storage entry points at chunk 0's bytes)
    "overlapping_chunks": ((4,), [".metadata", "fc1.weight"]),
    # the last chunk of a sharded tensor removed from chunks and storage_data: a hole
    "missing_chunk": ((4,), [".metadata", "fc1.weight"]),
    # a chunk listed in chunks whose storage_data entry is gone
    "chunk_without_storage": ((4,), [".metadata", "fc1.weight"]),
    # TensorStorageMetadata.size smaller than its chunks: a chunk outside the tensor
    "chunk_outside_tensor": ((4,), [".metadata", "fc1.weight"]),
    # TensorProperties.dtype says float64, the stored chunks are float32
    "dtype_mismatch": ((4,), [".metadata", "distcp", "fc1.weight"]),
    # _StorageInfo.transform_descriptors = ["stream.lzma9/1"] (an extension nobody knows)
    "unknown_transform": ((4, 5), [".metadata", "distcp", "fc1.weight"]),
    # a state_dict_metadata value of a class ckptfs does not know
    # (torch.distributed.checkpoint.metadata.QuantizedStorageMetadata)
    "unknown_entry_class": ((4, 5), [".metadata", "fc1.weight"]),
    # the pickled root object is torch.distributed.checkpoint.metadata.MetadataV9, not Metadata
    "unknown_metadata_class": ((4, 5), [".metadata"]),
    # .metadata cut in half (a torn write)
    "truncated_metadata": ((4,), [".metadata"]),
}
BAD_GOOD = "good"  # the unedited base, beside the variants: it must export fine
