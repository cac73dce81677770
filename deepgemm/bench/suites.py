"""Named sets of GEMM shapes (M, N, K) to benchmark, and the ``M,N,K`` argument parser."""

from __future__ import annotations

import argparse
import re
from itertools import product

from deepgemm.analysis.gemms import Workload, enumerate_gemms
from deepgemm.analysis.ops import ATTENTION_CORE
from deepgemm.analysis.presets import PRESETS

Shape = tuple[int, int, int]

SUITE_M_VALUES = (64, 128, 4096)

# DeepSeek-V3 inference GEMMs with fused projections: q_a+kv_a, q_b, kv_b, o_proj, expert gate/up, expert down.
DEEPSEEK_V3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))

SMOKE: tuple[Shape, ...] = ((64, 2112, 7168), (128, 7168, 2048), (4096, 4096, 7168))

_EXPLICIT_SUITES: dict[str, tuple[Shape, ...]] = {
    "deepseek-v3": tuple((m, n, k) for m, (n, k) in product(SUITE_M_VALUES, DEEPSEEK_V3_NK)),
    "smoke": SMOKE,
}

# Router GEMMs are tiny (N = experts) and run in bf16/fp32; they are left out of model-derived suites.
_EXCLUDED_FROM_SUITES = frozenset({"router"})


def suite_names() -> list[str]:
    return list(_EXPLICIT_SUITES) + [name for name in PRESETS if name not in _EXPLICIT_SUITES]


def suite_shapes(name: str) -> tuple[Shape, ...]:
    """The shapes of a suite: an explicit list, or a preset model's distinct linear-layer (N, K) at M in 64/128/4096."""
    key = name.strip().lower()
    if key in _EXPLICIT_SUITES:
        return _EXPLICIT_SUITES[key]
    if key not in PRESETS:
        raise ValueError(f"argument --suite: unknown suite {name!r} (known: {', '.join(suite_names())})")
    return tuple((m, n, k) for m, (n, k) in product(SUITE_M_VALUES, model_linear_nk(key)))


def model_linear_nk(model_name: str) -> list[tuple[int, int]]:
    """Distinct (N, K) of a preset's weight GEMMs (fused QKV and gate/up, one GPU), in layer order."""
    ops = enumerate_gemms(PRESETS[model_name], Workload(seq=1))
    seen: dict[tuple[int, int], None] = {}
    for op in ops:
        if op.category != ATTENTION_CORE and op.category not in _EXCLUDED_FROM_SUITES:
            seen.setdefault((op.n, op.k), None)
    return list(seen)


def parse_shape(text: str) -> Shape:
    """argparse type for ``--shape``: ``M,N,K`` (or ``MxNxK``) of positive integers."""
    parts = re.split(r"[,x×]", text.strip().lower())
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected M,N,K (three positive integers), got {text!r}")
    m, n, k = (int(p) for p in parts)
    if min(m, n, k) == 0:
        raise argparse.ArgumentTypeError(f"M, N and K must be positive, got {text!r}")
    return m, n, k


def format_shape(shape: Shape) -> str:
    return "{}x{}x{}".format(*shape)
