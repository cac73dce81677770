"""Persistent grid sizing shared by the GEMM families."""

from __future__ import annotations

from deepgemm.utils import ceil_div


def balanced_grid(tiles: int, slots: int) -> int:
    """The fewest CTAs that run `tiles` in as many waves as `slots` CTAs would: every CTA then gets the same
    number of tiles (512 tiles on 132 SMs: 128 CTAs of four, not 116 of four and 16 of three). The time in
    waves is unchanged; the SMs left idle leave power to the busy ones (the M = 4096 kernels run at the
    H200's power cap)."""
    if tiles <= 0 or slots <= 0:
        raise ValueError(f"balanced_grid needs positive tiles and slots, got {tiles}, {slots}")
    return ceil_div(tiles, ceil_div(tiles, slots))
