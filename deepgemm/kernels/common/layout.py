"""Strides the TMA descriptors take for the scale and operand layouts the kernels read."""

from __future__ import annotations

import torch

from deepgemm.utils import align_up, ceil_div


def tma_aligned_rows(m: int) -> int:
    """Rows of an M-major FP32 scale tensor padded so each column starts 16-byte aligned."""
    return align_up(m, 4)


def mn_major_row_stride(sf: torch.Tensor) -> int:
    """Distance between scale groups (columns) of an M-major scale tensor, in elements."""
    return sf.stride(1) if sf.shape[1] > 1 else tma_aligned_rows(sf.shape[0])


def tma_row_stride(t: torch.Tensor) -> int:
    """Row stride in elements to give TMA; a single-row tensor gets its padded width."""
    if t.shape[0] > 1:
        return t.stride(0)
    elem = t.element_size()
    return align_up(max(t.shape[1], 1) * elem, 16) // elem


def dense_last_box_rows(block_m: int, rows: int) -> int:
    """Rows per TMA box of A (and FP8's sfa) for the last M-block of a dense GEMM of `rows` rows; mirrors
    dense_last_box_rows in scheduler/persistent_tiles.cuh: the block's rows rounded up to 8 (block_m when M fills it).
    A box that overhangs the tensor by most of its rows is slow, so the kernels load that block through a second
    descriptor with this box."""
    rows = max(rows, 1)
    return align_up(rows - (ceil_div(rows, block_m) - 1) * block_m, 8)


def masked_sfa_strides(sfa: torch.Tensor) -> tuple[int, int] | None:
    """(K-block stride, group stride) in elements for reading masked-GEMM scales [G, max_m, K/128] in place through a
    3-D TMA box (M, K block, group), or None when TMA cannot take them (a copy is needed): M must be contiguous, the
    base 16-byte aligned and both strides positive multiples of 4 elements (16 bytes). The stride of a dimension of
    size 1 is never used, so it is replaced by a valid one (a [G, max_m, 1] or [1, max_m, K/128] tensor of any
    strides qualifies)."""
    groups, max_m, k_groups = sfa.shape
    if max_m > 1 and sfa.stride(1) != 1:
        return None
    k_block_stride = sfa.stride(2) if k_groups > 1 else align_up(max(max_m, 1), 4)
    group_stride = sfa.stride(0) if groups > 1 else k_block_stride * max(k_groups, 1)
    if k_block_stride <= 0 or group_stride <= 0 or k_block_stride % 4 or group_stride % 4 or sfa.data_ptr() % 16:
        return None
    return k_block_stride, group_stride
