"""The GEMM kinds the kernels' tile sequences know (mirrors deepgemm::GemmKind in scheduler/tile_sources.cuh)."""

from __future__ import annotations

import enum


class GemmKind(enum.IntEnum):
    """DENSE; the M-grouped kinds (B [G, N, K], one expert per tile); K_GROUPED (the BF16 kernel's: a K range per
    group into D [G, M, N])."""

    DENSE = 0
    GROUPED_CONTIGUOUS = 1
    GROUPED_MASKED = 2
    GROUPED_CONTIGUOUS_PSUM = 3
    K_GROUPED = 4
