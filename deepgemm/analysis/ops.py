"""One GEMM of a model step: its shape, how often it runs, and the bytes it moves.

Every product is ``D[m, n] = A[m, k] @ B[n, k]^T`` ("NT"), run ``batch`` times
per call (attention heads × sequences) and ``count`` times per step (layers).
A grouped GEMM (MoE experts) stacks the rows of all experts into ``m`` and
reads ``groups`` weight matrices. FLOPs are exact integers: 2·m·n·k·batch·count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from deepgemm.analysis.gpus import Precision

Phase = Literal["prefill", "decode", "train"]
Pass = Literal["forward", "dgrad", "wgrad"]
Kind = Literal["dense", "grouped", "batched"]

FP8_GROUP = 128  # activation scales: one per 1x128 group; weight scales: one per 128x128 block
SCALE_BYTES = 4  # fp32 scale factors
ATTENTION_CORE = "attention core"  # the category of QK^T / PV products (no weights)


@dataclass(frozen=True)
class Operand:
    """``matrices`` distinct [rows, cols] matrices in memory; ``on_chip`` ones never touch HBM."""

    matrices: int
    rows: int
    cols: int
    on_chip: bool = False

    @property
    def elements(self) -> int:
        return 0 if self.on_chip else self.matrices * self.rows * self.cols

    def transposed(self) -> Operand:
        return replace(self, rows=self.cols, cols=self.rows)


@dataclass(frozen=True)
class Traffic:
    """HBM bytes of one call, by operand."""

    a: int
    b: int
    d: int
    scales: int

    @property
    def total(self) -> int:
        return self.a + self.b + self.d + self.scales


@dataclass(frozen=True)
class GemmOp:
    name: str
    category: str
    phase: Phase
    kind: Kind
    m: int
    n: int
    k: int
    batch: int
    count: int
    precision: Precision
    a: Operand
    b: Operand
    d: Operand
    out_bytes: int = 2  # bf16 output; fp32 for weight gradients
    pass_: Pass = "forward"
    groups: int = 1  # weight matrices a grouped GEMM reads (experts that receive tokens)

    @property
    def flops_per_call(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def flops(self) -> int:
        return self.flops_per_call * self.count

    @property
    def traffic(self) -> Traffic:
        """Bytes one call moves: fp8 inputs carry fp32 scales (1x128 for A, 128x128 for B)."""
        if self.precision == "fp8":
            scales = (self.a.matrices * self.a.rows * _ceil_div(self.a.cols, FP8_GROUP) * SCALE_BYTES
                      if not self.a.on_chip else 0)
            scales += (self.b.matrices * _ceil_div(self.b.rows, FP8_GROUP) * _ceil_div(self.b.cols, FP8_GROUP)
                       * SCALE_BYTES if not self.b.on_chip else 0)
            return Traffic(self.a.elements, self.b.elements, self.d.elements * self.out_bytes, scales)
        return Traffic(2 * self.a.elements, 2 * self.b.elements, self.d.elements * self.out_bytes, 0)

    @property
    def bytes(self) -> int:
        return self.traffic.total * self.count

    @property
    def intensity(self) -> float:
        """FLOP per byte of HBM traffic."""
        total = self.traffic.total
        return self.flops_per_call / total if total else float("inf")

    @property
    def m_per_group(self) -> float:
        return self.m / self.groups

    @property
    def label(self) -> str:
        return self.name if self.pass_ == "forward" else f"{self.name} [{self.pass_}]"


def backward_ops(op: GemmOp, *, weight_grad_bytes: int = 4) -> tuple[GemmOp, GemmOp]:
    """The two GEMMs of ``op``'s backward pass.

    dgrad: dA[m, k] = dD[m, n] @ B[n, k]     -> M=m, N=k, K=n
    wgrad: dB[n, k] = dD[m, n]^T @ A[m, k]   -> M=n, N=k, K=m (a grouped op becomes K-grouped)
    Gradients of operands that stay on chip (fused attention) stay on chip too.
    """
    b_grad_bytes = op.out_bytes if op.category == ATTENTION_CORE else weight_grad_bytes
    dgrad = replace(op, m=op.m, n=op.k, k=op.n, pass_="dgrad", a=op.d, b=op.b.transposed(), d=op.a, out_bytes=2)
    wgrad = replace(op, m=op.n, n=op.k, k=op.m, pass_="wgrad", a=op.d.transposed(), b=op.a.transposed(),
                    d=op.b, out_bytes=b_grad_bytes)
    return dgrad, wgrad


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
