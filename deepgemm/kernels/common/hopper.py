"""Hopper (sm_90) facts the host planners mirror."""

from __future__ import annotations

import torch

SMEM_CAPACITY = 232_448  # bytes of dynamic shared memory a CTA may use on sm_90 (227 KB)


def elem_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of an output dtype (FP32 or BF16)."""
    return 4 if dtype == torch.float32 else 2
