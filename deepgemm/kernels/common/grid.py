"""Persistent grid sizing shared by the GEMM families."""

from __future__ import annotations

from deepgemm.utils import ceil_div

MAX_GRID_X = 2**31 - 1  # CUDA's grid limits: x up to 2^31 - 1 blocks, y up to 65535
MAX_GRID_Y = 65535

# Dense unsplit GEMMs with at least this K get a balanced grid (the configs' balanced_grid field): measured on the
# H200 0.5-2.4% faster for FP8 on six shapes with K of 1536-16384, 5% slower at K = 512 (4096 x 32768 x 512: 32 waves,
# 4 tiles in the last); BF16 0.2-0.7% faster at 4096 x 2112 x 7168 and 4096 x 4096 x 7168.
BALANCED_GRID_MIN_K = 1024


def balanced_grid_applies(k: int) -> bool:
    """Whether a dense GEMM with this K gets a balanced grid by default (FP8 and BF16 make_config)."""
    return k >= BALANCED_GRID_MIN_K


def balanced_grid(tiles: int, slots: int) -> int:
    """The fewest CTAs that run `tiles` in as many waves as `slots` CTAs would: every CTA then gets the same
    number of tiles (512 tiles on 132 SMs: 128 CTAs of four, not 116 of four and 16 of three). The time in
    waves is unchanged; the SMs left idle leave power to the busy ones (the M = 4096 kernels run at the
    H200's power cap)."""
    if tiles <= 0 or slots <= 0:
        raise ValueError(f"balanced_grid needs positive tiles and slots, got {tiles}, {slots}")
    return ceil_div(tiles, ceil_div(tiles, slots))
