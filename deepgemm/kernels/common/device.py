"""Per-device facts the planners need, read once."""

from __future__ import annotations

import functools
import os

import torch

DEFAULT_NUM_SMS = 132  # H200/H100 SXM; used when compiling without a GPU


def _sm_cap() -> int | None:
    override = os.environ.get("DEEPGEMM_NUM_SMS", "").strip()
    if not override:
        return None
    try:
        cap = int(override)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"DEEPGEMM_NUM_SMS={override!r}: expected a positive int (the most SMs a kernel may use)")
    return cap


@functools.cache
def physical_sm_count(device_index: int) -> int:
    """The device's SM count, before any DEEPGEMM_NUM_SMS cap (the most a per-call `num_sms` may ask for)."""
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


@functools.cache
def sm_count(device_index: int) -> int:
    """SMs the persistent kernels spread over by default (DEEPGEMM_NUM_SMS caps it; a call's `num_sms` replaces
    it for that call, e.g. to leave SMs to NCCL)."""
    available = physical_sm_count(device_index)
    cap = _sm_cap()
    return available if cap is None else min(available, cap)


def planning_sm_count() -> int:
    """SMs to plan for: the current GPU's (capped), or an H100/H200's under the same cap without a GPU."""
    if torch.cuda.is_available():
        return sm_count(torch.cuda.current_device())
    cap = _sm_cap()
    return DEFAULT_NUM_SMS if cap is None else min(DEFAULT_NUM_SMS, cap)


@functools.cache
def device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


@functools.cache
def is_sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)
