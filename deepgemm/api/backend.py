"""Which path serves a call: the sm_90a kernels, or the reference (dequantize + matmul)."""

from __future__ import annotations

import functools
from typing import Literal

import torch

from deepgemm.kernels.common.device import is_sm90
from deepgemm.env import env_flag

Backend = Literal["sm90", "reference", "bf16"]
Route = Literal["fp8", "bf16"]

# Below this many weight elements an FP8 layer (quantize + FP8 GEMM: two kernels) is slower than a BF16 matmul of
# its dequantized weight (one) at every token count measured on the H200 (docs/performance.md, "Fp8Linear routing").
FP8_LINEAR_MIN_WEIGHT_ELEMENTS = 2048 * 4096


@functools.cache
def _kernels_importable() -> bool:
    try:
        import cuda.bindings.driver  # noqa: F401
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


def supported(device: torch.device | int | str | None = None) -> bool:
    """True when deepgemm's own kernels can run on `device` (default: the current CUDA device).

    That is: DEEPGEMM_FORCE_REFERENCE is unset, torch sees a CUDA GPU, cuda-bindings imports, and the device is an
    sm_90 (Hopper) GPU. False for CPU devices.

    Args:
        device: a torch.device, a CUDA device index, a device string ("cuda:1"), or None for the current device.

    Raises:
        RuntimeError, AssertionError: from torch, for a device string that parses to no device type, or a CUDA
            index past the last GPU (asked only when a CUDA GPU is present; without one the answer is False).

    Example::

        if not deepgemm.supported():
            print("deepgemm runs its reference path here")
        deepgemm.supported(torch.device("cuda", 0))
    """
    if env_flag("DEEPGEMM_FORCE_REFERENCE"):
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


def fp8_linear_route(n: int, k: int) -> Route:
    """How an FP8 linear layer with an [n, k] weight runs: "fp8" (quantize + FP8 GEMM), or "bf16" (a matmul of the
    dequantized weight) where the kernel cannot take the shape (K % 16 != 0: TMA rows are 16-byte units) or is
    measured slower (a tiny weight)."""
    if k % 16 != 0 or n * k < FP8_LINEAR_MIN_WEIGHT_ELEMENTS:
        return "bf16"
    return "fp8"


def backend_for(*tensors: torch.Tensor, shape: tuple[int, int, int] | None = None) -> Backend:
    """The path a call on these tensors takes: "sm90" (our kernels) or "reference" (dequantize + matmul).

    With `shape` = (M, N, K) of an FP8 linear layer, the path `deepgemm.nn.Fp8Linear` takes: "bf16" where
    `fp8_linear_route` sends the shape to a matmul of the dequantized weight.

    Args:
        tensors: the call's tensors; the first one's device decides (no tensor: "reference").
        shape: optional (M, N, K) of an Fp8Linear call.

    Raises:
        Nothing it checks: the launch path asks it on every call, so it does not validate (a non-tensor fails
            with AttributeError, a `shape` of fewer than three ints with IndexError).

    Example::

        x = torch.randn(16, 7168, device="cuda", dtype=torch.bfloat16)
        assert deepgemm.backend_for(x) == "sm90"                       # on a Hopper GPU
        deepgemm.backend_for(x, shape=(16, 64, 100))                   # "bf16": K % 16 != 0
    """
    if shape is not None and fp8_linear_route(shape[1], shape[2]) == "bf16":
        return "bf16"
    if not tensors:
        return "reference"
    return _backend_for_device(tensors[0].device)


@functools.cache
def _backend_for_device(device: torch.device) -> Backend:
    # Cached per device: the launch path must not re-query the driver or the environment per call.
    if device.type != "cuda":
        return "reference"
    return "sm90" if supported(device) else "reference"
