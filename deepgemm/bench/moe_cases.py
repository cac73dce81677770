"""Named sets of MoE grouped GEMM cases for ``deepgemm bench --suite``: the forward pass's m-grouped GEMMs
(contiguous and masked layouts) and the expert weight gradients (k-grouped).

A case fixes every expert's token count, drawn once per suite from a seeded generator as MoE routing spreads tokens:
expected x U(0.7, 1.3), in a fixed order, so every run and every stored results file times the same rows. A case is
stored like a dense shape with its label in the measurement's ``case``: (valid rows, N, K) for an m-grouped case,
(M, N, total tokens) for a k-grouped one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from deepgemm.analysis.gpus import Precision
from deepgemm.bench.suites import Shape

MoeKind = Literal["contiguous", "masked", "k-grouped"]
ROW_SPREAD = (0.7, 1.3)
CONTIGUOUS_ALIGNMENT = 128  # rows per expert segment (padded with -1), as the contiguous layout needs
K_ALIGNMENT = 128  # k-grouped: every expert's token count is a multiple of 128
FP8_SCALE_BYTES = 4


@dataclass(frozen=True)
class MoeCase:
    kind: MoeKind
    groups: int
    expected_m: int
    counts: tuple[int, ...]  # valid rows per expert (k-grouped: tokens per expert, the K of its GEMM)
    n: int
    k: int  # k-grouped: all experts' tokens, sum(counts)
    max_m: int = 0  # masked: rows each group's slice holds
    m: int = 0  # k-grouped: rows of every expert's output (out[g] is m x n)

    @property
    def label(self) -> str:
        if self.kind == "k-grouped":
            return f"{self.kind} {self.groups}x~{self.expected_m} M={self.m} N={self.n}"
        bound = f" (max_m {self.max_m})" if self.kind == "masked" else ""
        return f"{self.kind} {self.groups}x~{self.expected_m}{bound} N={self.n} K={self.k}"

    @property
    def valid_rows(self) -> int:
        """Output rows the call defines: the routed tokens of an m-grouped case, M of a k-grouped one."""
        return self.m if self.kind == "k-grouped" else sum(self.counts)

    @property
    def shape(self) -> Shape:
        return self.valid_rows, self.n, self.k

    def m_indices(self) -> list[int]:
        """Contiguous layout: each expert's rows, its segment padded with -1 to a multiple of 128 rows."""
        rows: list[int] = []
        for group, count in enumerate(self.counts):
            padded = -(-count // CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT
            rows += [group] * count + [-1] * (padded - count)
        return rows

    def hbm_bytes(self, precision: Precision = "fp8") -> int:
        """m-grouped: A and D (BF16) on valid rows, every expert's weights, and in FP8 the FP32 scales of both.
        k-grouped (FP32 out added into in place): A and B once (in FP8 with their 1 x 128 scales), every expert's out
        read and written."""
        k_blocks = -(-self.k // 128)
        if self.kind == "k-grouped":
            out = 2 * 4 * self.groups * self.m * self.n
            if precision == "bf16":
                return 2 * self.k * (self.m + self.n) + out
            return self.k * (self.m + self.n) + FP8_SCALE_BYTES * k_blocks * (self.m + self.n) + out
        rows = self.valid_rows
        if precision == "bf16":
            return 2 * (rows * self.k + self.groups * self.n * self.k + rows * self.n)
        scales = FP8_SCALE_BYTES * (rows * k_blocks + self.groups * -(-self.n // 128) * k_blocks)
        return rows * self.k + self.groups * self.n * self.k + 2 * rows * self.n + scales


# DeepSeek-V3 expert GEMMs (gate/up N = 4096 with K = 7168, down N = 7168 with K = 2048): prefill as contiguous
# segments, decode and chunked prefill as masked slices (issue 5's cases).
_DEEPSEEK_V3_CONTIGUOUS = ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048))
_DEEPSEEK_V3_MASKED = ((1, 1024, 4096, 4096, 7168), (2, 512, 4096, 4096, 7168), (4, 256, 4096, 4096, 7168),
                       (1, 1024, 4096, 7168, 2048), (2, 512, 4096, 7168, 2048), (4, 256, 4096, 7168, 2048),
                       (32, 16, 128, 4096, 7168), (256, 8, 128, 2048, 7168), (64, 32, 128, 7168, 2048),
                       (8, 64, 128, 4096, 7168))
# Their weight gradients dW_g = dY_g^T X_g over each expert's tokens, (groups, expected tokens, M, N). FP8: the
# experts' own weights (gate/up 4096 x 7168, down 7168 x 2048) at 4 x ~8192 and 8 x ~4096 tokens, DeepGEMM's own
# benchmark cases; BF16: issue 23's M = N = 4096 and 7168 at ~4096 tokens.
_DEEPSEEK_V3_K_GROUPED = {
    "fp8": ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)),
    "bf16": ((4, 4096, 4096, 4096), (4, 4096, 7168, 7168), (8, 4096, 4096, 4096), (8, 4096, 7168, 7168)),
}


def _counts(groups: int, expected: int, rng: random.Random, cap: int | None) -> tuple[int, ...]:
    low, high = ROW_SPREAD
    return tuple(min(cap or 1 << 30, max(1, round(expected * rng.uniform(low, high)))) for _ in range(groups))


def _tokens(groups: int, expected: int, rng: random.Random) -> tuple[int, ...]:
    low, high = ROW_SPREAD
    return tuple(K_ALIGNMENT * max(1, round(expected * rng.uniform(low, high) / K_ALIGNMENT)) for _ in range(groups))


def deepseek_v3_moe(seed: int = 0, precision: Precision = "fp8") -> tuple[MoeCase, ...]:
    """The 14 m-grouped cases, then the precision's 4 k-grouped ones; counts drawn in one fixed order
    (dev/bench_grouped.py and dev/bench_grouped_bf16.py draw the same ones)."""
    rng = random.Random(seed)
    contiguous = [MoeCase("contiguous", g, e, _counts(g, e, rng, None), n, k) for g, e, n, k in _DEEPSEEK_V3_CONTIGUOUS]
    masked = [MoeCase("masked", g, e, _counts(g, e, rng, max_m), n, k, max_m) for g, e, max_m, n, k in _DEEPSEEK_V3_MASKED]
    cases = contiguous + masked
    for g, e, m, n in _DEEPSEEK_V3_K_GROUPED[precision]:
        ks = _tokens(g, e, rng)
        cases.append(MoeCase("k-grouped", g, e, ks, n, sum(ks), m=m))
    if len({case.shape for case in cases}) != len(cases):  # results files key measurements by shape
        raise AssertionError("two MoE cases of one suite store the same (rows, N, K)")
    return tuple(cases)


MOE_SUITES = {"deepseek-v3-moe": deepseek_v3_moe}


def is_moe_suite(name: str) -> bool:
    return name.strip().lower() in MOE_SUITES


def moe_suite(name: str, precision: Precision = "fp8") -> tuple[MoeCase, ...]:
    """The suite's cases in `precision` (the k-grouped weight gradients differ: see _DEEPSEEK_V3_K_GROUPED)."""
    return MOE_SUITES[name.strip().lower()](precision=precision)
