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
    return diff_from_sums(*diff_sums(x, y, "calc_diff"))


# calc_diff's float64 temporaries hold at most this many elements (512 MiB each): a 32768 x 57344 output converted
# whole would take 15 GB per temporary.
DIFF_CHUNK_ELEMENTS = 1 << 26


def diff_sums(x: torch.Tensor, y: torch.Tensor, caller: str = "diff_sums") -> tuple[float, float]:
    """(sum(x*y), sum(x^2 + y^2)) of two tensors of one shape, in float64, DIFF_CHUNK_ELEMENTS at a time; sums of
    several pairs (e.g. row blocks of one output) add up to the pairs' calc_diff by diff_from_sums."""
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{caller}: '{name}' must be a torch.Tensor, got {type(value).__name__}")
    if x.shape != y.shape:
        raise ValueError(f"{caller}: 'x' has shape {tuple(x.shape)} but 'y' has shape {tuple(y.shape)}; they must match")
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    dot = torch.zeros((), dtype=torch.float64, device=x.device)
    squares = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, flat_x.numel(), DIFF_CHUNK_ELEMENTS):
        x64 = flat_x[start:start + DIFF_CHUNK_ELEMENTS].double()
        y64 = flat_y[start:start + DIFF_CHUNK_ELEMENTS].double()
        dot += (x64 * y64).sum()
        squares += (x64 * x64 + y64 * y64).sum()
    return float(dot), float(squares)


def diff_from_sums(dot: float, squares: float) -> float:
    """calc_diff from diff_sums' two sums: 0 when both tensors are all zeros, NaN where a sum is."""
    return 0.0 if squares == 0 else 1.0 - 2.0 * dot / squares


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
