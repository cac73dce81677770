"""Which path serves a call: the sm_90a kernels, or the reference (dequantize + matmul)."""

from __future__ import annotations

import functools
import os
from typing import Literal

import torch

from deepgemm.kernels.common.device import is_sm90

Backend = Literal["sm90", "reference"]


@functools.cache
def _kernels_importable() -> bool:
    try:
        import cuda.bindings.driver  # noqa: F401
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


def supported(device: torch.device | int | str | None = None) -> bool:
    """True when deepgemm's own kernels can run on `device` (default: the current CUDA device)."""
    if os.environ.get("DEEPGEMM_FORCE_REFERENCE"):
        return False
    if not torch.cuda.is_available() or not _kernels_importable():
        return False
    if device is None:
        index = torch.cuda.current_device()
    else:
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type != "cuda":
            return False
        index = dev.index if dev.index is not None else torch.cuda.current_device()
    return is_sm90(index)


def backend_for(*tensors: torch.Tensor) -> Backend:
    """The path a call on these tensors takes: "sm90" (our kernels) or "reference"."""
    if not tensors:
        return "reference"
    return _backend_for_device(tensors[0].device)


@functools.cache
def _backend_for_device(device: torch.device) -> Backend:
    # Cached per device: the launch path must not re-query the driver or the environment per call.
    if device.type != "cuda":
        return "reference"
    return "sm90" if supported(device) else "reference"
