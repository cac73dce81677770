"""Named sets of GEMM shapes (M, N, K) to benchmark, and the ``M,N,K`` argument parser."""

from __future__ import annotations

import argparse
import re
from itertools import product

from deepgemm.analysis.gemms import BF16_CATEGORIES, Workload, enumerate_gemms
from deepgemm.analysis.ops import ATTENTION_CORE
from deepgemm.analysis.presets import PRESETS

Shape = tuple[int, int, int]

SUITE_M_VALUES = (64, 128, 4096)
# Per-GPU decode batches below one 64-row block (the tokens one GPU sees per step in serving).
DECODE_M_VALUES = (1, 8, 16, 32)

# DeepSeek-V3 inference GEMMs with fused projections: q_a+kv_a, q_b, kv_b, o_proj, expert gate/up, expert down.
DEEPSEEK_V3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))

SMOKE: tuple[Shape, ...] = ((64, 2112, 7168), (128, 7168, 2048), (4096, 4096, 7168))

# Prefill breadth: the FP8 linear layers (fused QKV, o_proj, fused gate/up or expert, down; one GPU; the LM head and
# router stay BF16 in practice) of common open models at 256 to 32768 tokens, against the same peers as deepseek-v3.
LLM_PREFILL_MODELS = ("llama-3-8b", "llama-3-70b", "qwen2.5-7b", "qwen3-30b-a3b")
LLM_PREFILL_M_VALUES = (256, 4096, 32768)


def _llm_prefill() -> tuple[Shape, ...]:
    pairs = dict.fromkeys(nk for model in LLM_PREFILL_MODELS for nk in model_linear_nk(model, fp8_only=True))
    return tuple((m, n, k) for (n, k) in pairs for m in LLM_PREFILL_M_VALUES)


_EXPLICIT_SUITES: dict[str, tuple[Shape, ...]] = {
    "deepseek-v3": tuple((m, n, k) for m, (n, k) in product(SUITE_M_VALUES, DEEPSEEK_V3_NK)),
    "deepseek-v3-decode": tuple((m, n, k) for m, (n, k) in product(DECODE_M_VALUES, DEEPSEEK_V3_NK)),
    "smoke": SMOKE,
}
_COMPUTED_SUITES = {"llm-prefill": _llm_prefill}

# Router GEMMs are tiny (N = experts) and run in bf16/fp32; they are left out of model-derived suites.
_EXCLUDED_FROM_SUITES = frozenset({"router"})


def suite_names() -> list[str]:
    return list(_EXPLICIT_SUITES) + list(_COMPUTED_SUITES) + [name for name in PRESETS if name not in _EXPLICIT_SUITES]


def suite_shapes(name: str) -> tuple[Shape, ...]:
    """The shapes of a suite: an explicit list, or a preset model's distinct linear-layer (N, K) at M in 64/128/4096."""
    key = name.strip().lower()
    if key in _EXPLICIT_SUITES:
        return _EXPLICIT_SUITES[key]
    if key in _COMPUTED_SUITES:
        return _COMPUTED_SUITES[key]()
    if key not in PRESETS:
        raise ValueError(f"argument --suite: unknown suite {name!r} (known: {', '.join(suite_names())})")
    return tuple((m, n, k) for m, (n, k) in product(SUITE_M_VALUES, model_linear_nk(key)))


def model_linear_nk(model_name: str, *, fp8_only: bool = False) -> list[tuple[int, int]]:
    """Distinct (N, K) of a preset's weight GEMMs (fused QKV and gate/up, one GPU), in layer order; fp8_only: without
    the layers that stay BF16 (LM head)."""
    ops = enumerate_gemms(PRESETS[model_name], Workload(seq=1))
    seen: dict[tuple[int, int], None] = {}
    for op in ops:
        if op.category != ATTENTION_CORE and op.category not in _EXCLUDED_FROM_SUITES and not (
                fp8_only and op.category in BF16_CATEGORIES):
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
