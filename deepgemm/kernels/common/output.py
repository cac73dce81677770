"""The OutputDescriptors every GEMM epilogue stores through (epilogue/store_fragment.cuh)."""

from __future__ import annotations

import torch

from deepgemm.jit.tma import encode_2d, encode_3d

PIECE_WIDTHS = (128, 64, 32, 16)  # bytes per row of each store descriptor's box, in OutputDescriptors' order
# OutputDescriptors for a kernel that never stores through them (outputs written straight from registers).
NO_OUTPUT_DESCRIPTORS = bytes(128 * len(PIECE_WIDTHS))


def output_descriptors(d: torch.Tensor, rows: int, n: int, row_stride: int) -> bytes:
    """The four store descriptors of a [rows, n] output (piece widths 128/64/32/16 bytes, 64-row boxes, each piece
    with the swizzle of its width; the 16-byte piece unswizzled), packed as OutputDescriptors."""
    per_16b = 16 // d.element_size()
    return b"".join(encode_2d(d.data_ptr(), d.dtype, rows, n, row_stride, 64, width // 16 * per_16b,
                              width if width > 16 else 0) for width in PIECE_WIDTHS)


def output_descriptors_3d(d: torch.Tensor) -> bytes:
    """output_descriptors of a contiguous [slices, rows, n] output as 3-D maps (boxes one slice deep), so a
    store's 64-row box is clipped at the end of its slice's rows (store_fragment.cuh, kRank 3)."""
    slices, rows, n = d.shape
    per_16b = 16 // d.element_size()
    return b"".join(encode_3d(d.data_ptr(), d.dtype, (n, rows, slices), (n, rows * n), (width // 16 * per_16b, 64, 1),
                              width if width > 16 else 0) for width in PIECE_WIDTHS)
