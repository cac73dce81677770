"""Small numeric helpers shared by the host code and the tests."""

from __future__ import annotations

import os
import warnings

import torch


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(value: int) -> int:
    """The smallest power of two >= value (1 for value <= 1)."""
    return 1 << max(0, value - 1).bit_length()


def align_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """Relative difference 1 - 2*sum(x*y) / sum(x^2 + y^2), computed in float64.

    0 for identical tensors, about the squared relative error for close ones. NaN/Inf in either
    input gives NaN (which compares false against any tolerance). x and y must have the same shape (no
    broadcasting: a [M, N] result against a [N] reference is a bug, not a comparison).

    Args:
        x / y: tensors of one shape on one device, any dtypes (both are converted to float64).

    Raises:
        TypeError: `x` or `y` is not a tensor.
        ValueError: their shapes differ.

    Example::

        ref = x.double() @ w.double().t()
        y = deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x), deepgemm.quantize_per_block(w))
        assert deepgemm.calc_diff(y, ref) < 1e-3
    """
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"calc_diff: '{name}' must be a torch.Tensor, got {type(value).__name__}")
    if x.shape != y.shape:
        raise ValueError(f"calc_diff: 'x' has shape {tuple(x.shape)} but 'y' has shape {tuple(y.shape)}; they must match")
    x64, y64 = x.double(), y.double()
    denominator = (x64 * x64 + y64 * y64).sum()
    if denominator == 0:
        return 0.0
    return float(1.0 - 2.0 * (x64 * y64).sum() / denominator)


# Environment variables that used to switch algorithms; each is now a GemmConfig field a plan receives.
REMOVED_ENVIRONMENT = {
    "DEEPGEMM_SPLIT_TAIL": "GemmConfig.split_tail (pass a config to get_plan(config=...), or let `deepgemm tune` choose)",
    "DEEPGEMM_NARROW_LAST_N": "GemmConfig.narrow_last_n",
    "DEEPGEMM_CLUSTER_M": "GemmConfig.cluster_m (the tuner times 2-CTA clusters)",
    "DEEPGEMM_BALANCED_GRID": "GemmConfig.balanced_grid",
}


def warn_removed_environment() -> None:
    """Warn once per removed algorithm switch still set in the environment (it no longer has an effect)."""
    for name, replacement in REMOVED_ENVIRONMENT.items():
        if name in os.environ:
            warnings.warn(f"{name} is no longer read: algorithm choices are config fields now; use {replacement}",
                          UserWarning, stacklevel=3)
