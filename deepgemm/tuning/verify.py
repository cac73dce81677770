"""The autotuners' correctness gate: a timed candidate's output against a float32 product of the same inputs, so a
wrong build (a kernel or config bug) is never recorded as the fastest."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TypeVar

import torch

from deepgemm.errors import DeepGemmError
from deepgemm.utils import calc_diff

# calc_diff a candidate may show against the float32 product (the benchmark's accuracy tolerance; FP8 with BF16
# output sits near 1e-5, BF16 near 1e-6).
MAX_CALC_DIFF = 1e-3

Config = TypeVar("Config")


def candidate_error(out: torch.Tensor, reference: torch.Tensor) -> float | None:
    """None when `out` matches `reference` (calc_diff below MAX_CALC_DIFF), else its calc_diff (NaN where an element
    was never written: the tuners poison the output with NaN before timing)."""
    diff = calc_diff(out.float(), reference)
    return None if diff < MAX_CALC_DIFF else diff


def settle(where: str, timings: Sequence[tuple[Config, float]], rejected: Sequence[tuple[Config, float]],
           label: str) -> None:
    """Warn about the rejected candidates; raise when none passed (nothing trustworthy to record)."""
    if not rejected:
        return
    listed = ", ".join(f"{getattr(config, 'label', lambda: config)()} (calc_diff {_show(diff)})"
                       for config, diff in rejected)
    if not timings:
        raise DeepGemmError(f"tuning {where} {label}: every candidate's output was wrong: {listed}")
    warnings.warn(f"tuning {where} {label}: left out {len(rejected)} candidate(s) whose output was wrong: {listed}",
                  RuntimeWarning, stacklevel=3)


def _show(diff: float) -> str:
    return "NaN: elements never written" if math.isnan(diff) else f"{diff:.2e}"
