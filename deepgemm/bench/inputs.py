"""Random GEMM operands on the GPU, in every form the implementations need, and float64 references."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from deepgemm.analysis.gpus import Precision
from deepgemm.api.quant import quantize_per_block, quantize_per_token_group
from deepgemm.bench.suites import Shape
from deepgemm.utils import calc_diff, diff_from_sums, diff_sums

GROUP = 128
# A float64 reference larger than this is not kept: every check computes it again, a block of rows at a time
# (REFERENCE_BLOCK_BYTES each). The llm-prefill suite's 32768 x 57344 output would need 15 GB for it (twice with the
# per-tensor peer's), which with five outputs and their checks did not fit an 80 GB card.
REFERENCE_KEEP_BYTES = 1 << 31
REFERENCE_BLOCK_BYTES = 1 << 29


@dataclass(frozen=True)
class RowBlockProduct:
    """The float64 product ``a @ b^T`` never held whole: :meth:`blocks` computes it a block of rows at a time."""

    a: Any  # [M, K]
    b: Any  # [N, K]

    @property
    def shape(self) -> tuple[int, int]:
        return self.a.shape[0], self.b.shape[0]

    def blocks(self) -> Iterator[tuple[int, Any]]:
        """(first row, float64 rows of the product) for consecutive blocks of REFERENCE_BLOCK_BYTES at most."""
        b64 = self.b.double()
        rows = max(1, REFERENCE_BLOCK_BYTES // (8 * max(1, self.b.shape[0])))
        for first in range(0, self.a.shape[0], rows):
            yield first, self.a[first:first + rows].double() @ b64.t()


def product_reference(a: Any, b: Any) -> Any:
    """float64 ``a @ b^T``: the tensor, or a RowBlockProduct where it would exceed REFERENCE_KEEP_BYTES."""
    if 8 * a.shape[0] * b.shape[0] > REFERENCE_KEEP_BYTES:
        return RowBlockProduct(a, b)
    return a.double() @ b.double().t()


def reference_diff(out: Any, reference: Any) -> float:
    """calc_diff of an output against its reference: a tensor, or a RowBlockProduct compared block by block."""
    if not isinstance(reference, RowBlockProduct):
        return calc_diff(out, reference)
    if tuple(out.shape) != reference.shape:
        raise ValueError(f"reference_diff: the output has shape {tuple(out.shape)} but the reference "
                         f"{reference.shape}; they must match")
    dot = squares = 0.0
    for first, block in reference.blocks():
        block_dot, block_squares = diff_sums(out[first:first + block.shape[0]], block, "reference_diff")
        dot += block_dot
        squares += block_squares
    return diff_from_sums(dot, squares)


@dataclass
class Problem:
    """One shape's operands: ``D[m, n] = A[m, k] @ B[n, k]^T``.

    fp8 problems hold e4m3 payloads with deepgemm's scales (``sfa`` M-major as quantize_per_token_group
    returns it; ``sfa_cublas`` the same values with strides (1, M) as cuBLAS wants) and the dequantized
    values rounded to bf16 for the bf16 peer; bf16 problems hold random bf16 operands only.
    """

    m: int
    n: int
    k: int
    precision: Precision
    a_bf16: Any
    b_bf16: Any
    a_fp8: Any = None
    sfa: Any = None
    sfa_cublas: Any = None
    b_fp8: Any = None
    sfb: Any = None
    _exact_a: Any = field(default=None, repr=False)  # float64 values the fp8 operands stand for
    _exact_b: Any = field(default=None, repr=False)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> Shape:
        return self.m, self.n, self.k

    @property
    def label(self) -> str:
        return ""

    def reference(self) -> Any:
        """float64 product of the exact (dequantized) inputs (product_reference: a RowBlockProduct when large)."""
        if "scaled" not in self._cache:
            a, b = (self._exact_a, self._exact_b) if self.precision == "fp8" else (self.a_bf16, self.b_bf16)
            self._cache["scaled"] = product_reference(a, b)
        return self._cache["scaled"]

    def bf16_operands(self, layout: str) -> tuple[Any, Any]:
        """A and B in the stored forms of a BF16 GEMM ``layout`` ("nt", "nn", "tn", "tt"): A as [M, K] (first letter
        n) or [K, M] (t), B as [N, K] (second letter t) or [K, N] (n); the same values as ``a_bf16``/``b_bf16``
        (so :meth:`reference` holds), laid out once and shared by every implementation of the run."""
        key = f"bf16-{layout}"
        if key not in self._cache:
            a = self.a_bf16 if layout[0] == "n" else self.a_bf16.t().contiguous()
            b = self.b_bf16 if layout[1] == "t" else self.b_bf16.t().contiguous()
            self._cache[key] = (a, b)
        return self._cache[key]

    def unscaled_reference(self) -> Any:
        """float64 product of the raw e4m3 payloads (what a per-tensor scale of 1 computes; product_reference)."""
        if "unscaled" not in self._cache:
            self._cache["unscaled"] = product_reference(self.a_fp8, self.b_fp8)
        return self._cache["unscaled"]


def make_problem(shape: Shape, precision: Precision, *, device: Any, seed: int = 0) -> Problem:
    import torch

    m, n, k = shape
    generator = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn((m, k), generator=generator, device=device, dtype=torch.float32)
    b = torch.randn((n, k), generator=generator, device=device, dtype=torch.float32)
    if precision == "bf16":
        return Problem(m, n, k, "bf16", a.bfloat16(), b.bfloat16())
    a_fp8, sfa = quantize_per_token_group(a, GROUP)
    b_fp8, sfb = quantize_per_block(b, GROUP)
    exact_a = dequantize(a_fp8, sfa, GROUP, 1)
    exact_b = dequantize(b_fp8, sfb, GROUP, GROUP)
    sfa_cublas = sfa if sfa.stride() == (1, m) else sfa.t().contiguous().t()
    return Problem(m, n, k, "fp8", exact_a.bfloat16(), exact_b.bfloat16(), a_fp8, sfa, sfa_cublas, b_fp8, sfb,
                   exact_a, exact_b)


def dequantize(q: Any, scales: Any, col_block: int, row_block: int) -> Any:
    """Exact values in float64: every scale covers ``row_block`` rows x ``col_block`` columns."""
    rows, cols = q.shape
    expanded = scales.double().repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(col_block, dim=1)
    return q.double() * expanded[:, :cols]
