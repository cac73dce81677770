"""Per-device facts the planners need, read once."""

from __future__ import annotations

import functools
import os

import torch

DEFAULT_NUM_SMS = 132  # H200/H100 SXM; used when compiling without a GPU


@functools.cache
def sm_count(device_index: int) -> int:
    """SMs the persistent kernels spread over (DEEPGEMM_NUM_SMS caps it, e.g. to leave SMs to NCCL)."""
    available = torch.cuda.get_device_properties(device_index).multi_processor_count
    override = os.environ.get("DEEPGEMM_NUM_SMS")
    if override:
        return max(1, min(available, int(override)))
    return available


@functools.cache
def device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)
