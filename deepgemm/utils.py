"""Small numeric helpers shared by the host code and the tests."""

from __future__ import annotations

import torch


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """Relative difference 1 - 2*sum(x*y) / sum(x^2 + y^2), computed in float64.

    0 for identical tensors, about the squared relative error for close ones. NaN/Inf in either
    input gives NaN (which compares false against any tolerance).
    """
    x64, y64 = x.double(), y.double()
    denominator = (x64 * x64 + y64 * y64).sum()
    if denominator == 0:
        return 0.0
    return float(1.0 - 2.0 * (x64 * y64).sum() / denominator)
