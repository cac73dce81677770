"""The autotuners' correctness gate: a timed candidate's output against a float32 product of the same inputs, so a
wrong build (a kernel or config bug) is never recorded as the fastest."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Protocol, TypeVar

import torch

from deepgemm.errors import DeepGemmError
from deepgemm.utils import calc_diff

# calc_diff a candidate may show against the float32 product. A right kernel's is its output rounding: ~6e-7 with
# BF16 output (FP8 or BF16 operands), ~1e-8 with FP32. One wrong 128 x 128 tile of 4096 x 7168 already shows
# ~2.8e-4 (a wrong fraction f of the elements: about f / 2), one wrong row of 4096 ~1.2e-4.
MAX_CALC_DIFF = 1e-5

class Labelled(Protocol):
    def label(self) -> str: ...


Config = TypeVar("Config", bound=Labelled)


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
    listed = ", ".join(f"{config.label()} (calc_diff {_show(diff)})" for config, diff in rejected)
    if not timings:
        raise DeepGemmError(f"tuning {where} {label}: every candidate's output was wrong: {listed}")
    warnings.warn(f"tuning {where} {label}: left out {len(rejected)} candidate(s) whose output was wrong: {listed}",
                  RuntimeWarning, stacklevel=3)


def _show(diff: float) -> str:
    return "NaN: elements never written" if math.isnan(diff) else f"{diff:.2e}"
