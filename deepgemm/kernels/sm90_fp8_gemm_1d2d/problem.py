"""The problem a config is chosen for: one frozen descriptor that flows into the heuristics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepgemm.kernels.common.hopper import elem_bytes
from deepgemm.kernels.common.kind import GemmKind

__all__ = ["GemmKind", "GemmProblem"]


@dataclass(frozen=True)
class GemmProblem:
    """D[m, n] = A[m, k] B[n, k]^T as the tile choice sees it.

    m: the rows the tiles are sized for: M (dense), M_total (contiguous) or the expected rows per group (masked,
    which also gives max_m, the rows each group holds). groups: experts sharing N and K.
    """

    m: int
    n: int
    k: int
    num_sms: int
    out_dtype: torch.dtype = torch.bfloat16
    kind: GemmKind = GemmKind.DENSE
    groups: int = 1
    max_m: int = 0

    @property
    def out_elem_bytes(self) -> int:
        return elem_bytes(self.out_dtype)
