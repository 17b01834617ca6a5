"""Tensor-parallel slicing shared by the fixture generators (gen/generate.py: DeepSpeed AutoTP / Megatron-
DeepSpeed, torch tensors; gen_megatron: Megatron-LM, numpy arrays): rank r's part of an unsplit tensor under
the split rules the frameworks share.  Plain indexing, so it works on both kinds of array and returns views
(the caller copies); every split is even, as the frameworks require."""


def _block(size, r, tp):
    n = size // tp
    assert n * tp == size, f"{size} does not split evenly over TP {tp}"
    return slice(r * n, (r + 1) * n)


def tp_rows(full, r, tp):
    """Column-parallel (and vocab-parallel) weights: rank r's block of rows (dim 0)."""
    return full[_block(full.shape[0], r, tp)]


def tp_cols(full, r, tp):
    """Row-parallel weights: rank r's block of columns (dim 1)."""
    return full[:, _block(full.shape[1], r, tp)]


def tp_gated_rows(full, r, tp):
    """A fused gated MLP input ([all gate rows; all up rows]): rank r holds [gate_r; up_r]; returns the two
    parts for the caller to concatenate."""
    half = full.shape[0] // 2
    assert 2 * half == full.shape[0], f"{full.shape[0]} rows do not halve into gate and up"
    return tp_rows(full[:half], r, tp), tp_rows(full[half:], r, tp)
