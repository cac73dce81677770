"""Operand and scale-factor layouts: what the GEMMs' TMA reads, and conversions from natural layouts."""

from __future__ import annotations

import torch

from deepgemm.kernels.common.layout import tma_aligned_rows


def is_mn_major_tma_aligned(sf: torch.Tensor) -> bool:
    m, groups = sf.shape
    if m > 1 and sf.stride(0) != 1:
        return False
    if groups > 1 and (sf.stride(1) < m or sf.stride(1) % 4 != 0):
        return False
    return sf.data_ptr() % 16 == 0


def to_mn_major_tma_aligned(sf: torch.Tensor) -> torch.Tensor:
    """[M, G] float32 scales as a view with strides (1, align(M, 4)); no copy when already so.

    The layout fp8_gemm_nt's TMA reads sfa in: M-major (unit stride along M), the columns a multiple of 16 bytes
    apart, the base 16-byte aligned. quantize_per_token_group already returns it;
    the GEMMs convert other layouts themselves (a copy per call), so convert once where the same scales are reused.

    Args:
        sf: float32 [M, G] scales, any strides and device.

    Raises:
        TypeError: `sf` is not a 2-D float32 tensor.

    Example::

        sf = torch.rand(4096, 56, device="cuda")            # row-major
        sf_tma = deepgemm.to_mn_major_tma_aligned(sf)       # same values, strides (1, 4096)
    """
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or sf.dim() != 2:
        raise TypeError(f"to_mn_major_tma_aligned: 'sf' must be a 2-D float32 tensor, got {getattr(sf, 'dtype', type(sf))}")
    if is_mn_major_tma_aligned(sf):
        return sf
    m, groups = sf.shape
    storage = torch.empty((groups, tma_aligned_rows(m)), dtype=torch.float32, device=sf.device)
    view = storage[:, :m]
    view.copy_(sf.t())
    return view.t()


def tma_rows(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a contiguous copy when its rows are 0 bytes apart (a broadcast such as x.expand(M, K)): TMA walks rows
    by a positive stride. Applied before the path is chosen, so both paths read the same operand."""
    return t.contiguous() if t.dim() == 2 and t.shape[0] > 1 and t.stride(0) == 0 else t
