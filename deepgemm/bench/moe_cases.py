"""Named sets of MoE grouped GEMM cases (contiguous and masked layouts) for ``deepgemm bench --suite``.

A case fixes every expert's token count, drawn once per suite from a seeded generator as MoE routing spreads tokens:
expected x U(0.7, 1.3), in a fixed order, so every run and every stored results file times the same rows. A case is
stored like a dense shape, as (valid rows, N, K) with its label in the measurement's note.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from deepgemm.bench.suites import Shape

MoeKind = Literal["contiguous", "masked"]
ROW_SPREAD = (0.7, 1.3)
CONTIGUOUS_ALIGNMENT = 128  # rows per expert segment (padded with -1), as the contiguous layout needs


@dataclass(frozen=True)
class MoeCase:
    kind: MoeKind
    groups: int
    expected_m: int
    counts: tuple[int, ...]  # valid rows per expert
    n: int
    k: int
    max_m: int = 0  # masked: rows each group's slice holds

    @property
    def label(self) -> str:
        bound = f" (max_m {self.max_m})" if self.kind == "masked" else ""
        return f"{self.kind} {self.groups}x~{self.expected_m}{bound} N={self.n} K={self.k}"

    @property
    def valid_rows(self) -> int:
        return sum(self.counts)

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

    def hbm_bytes(self) -> int:
        """A and D on valid rows, every expert's weights, and the FP32 scales of both."""
        k_blocks = -(-self.k // 128)
        rows = self.valid_rows
        scales = 4 * (rows * k_blocks + self.groups * -(-self.n // 128) * k_blocks)
        return rows * self.k + self.groups * self.n * self.k + 2 * rows * self.n + scales


# DeepSeek-V3 expert GEMMs (gate/up N = 4096 with K = 7168, down N = 7168 with K = 2048): prefill as contiguous
# segments, decode and chunked prefill as masked slices (issue 5's cases).
_DEEPSEEK_V3_CONTIGUOUS = ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048))
_DEEPSEEK_V3_MASKED = ((1, 1024, 4096, 4096, 7168), (2, 512, 4096, 4096, 7168), (4, 256, 4096, 4096, 7168),
                       (1, 1024, 4096, 7168, 2048), (2, 512, 4096, 7168, 2048), (4, 256, 4096, 7168, 2048),
                       (32, 16, 128, 4096, 7168), (256, 8, 128, 2048, 7168), (64, 32, 128, 7168, 2048),
                       (8, 64, 128, 4096, 7168))


def _counts(groups: int, expected: int, rng: random.Random, cap: int | None) -> tuple[int, ...]:
    low, high = ROW_SPREAD
    return tuple(min(cap or 1 << 30, max(1, round(expected * rng.uniform(low, high)))) for _ in range(groups))


def deepseek_v3_moe(seed: int = 0) -> tuple[MoeCase, ...]:
    """The 14 cases, counts drawn in one fixed order (dev/bench_grouped.py draws the same ones)."""
    rng = random.Random(seed)
    contiguous = [MoeCase("contiguous", g, e, _counts(g, e, rng, None), n, k) for g, e, n, k in _DEEPSEEK_V3_CONTIGUOUS]
    masked = [MoeCase("masked", g, e, _counts(g, e, rng, max_m), n, k, max_m) for g, e, max_m, n, k in _DEEPSEEK_V3_MASKED]
    cases = tuple(contiguous + masked)
    if len({case.shape for case in cases}) != len(cases):  # results files key measurements by shape
        raise AssertionError("two MoE cases of one suite store the same (rows, N, K)")
    return cases


MOE_SUITES = {"deepseek-v3-moe": deepseek_v3_moe}


def is_moe_suite(name: str) -> bool:
    return name.strip().lower() in MOE_SUITES


def moe_suite(name: str) -> tuple[MoeCase, ...]:
    return MOE_SUITES[name.strip().lower()]()
