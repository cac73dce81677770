"""The OutputDescriptors every GEMM epilogue stores through (epilogue/store_fragment.cuh)."""

from __future__ import annotations

import torch

from deepgemm.jit.tma import encode_2d


def output_descriptors(d: torch.Tensor, rows: int, n: int, row_stride: int) -> bytes:
    """The four store descriptors of a [rows, n] output (piece widths 128/64/32/16 bytes, 64-row boxes, each piece
    with the swizzle of its width; the 16-byte piece unswizzled), packed as OutputDescriptors."""
    per_16b = 16 // d.element_size()
    return b"".join(encode_2d(d.data_ptr(), d.dtype, rows, n, row_stride, 64, width // 16 * per_16b,
                              width if width > 16 else 0) for width in (128, 64, 32, 16))
