"""Kernel configurations of the FP8 1D2D GEMM as frozen data."""

from __future__ import annotations

from dataclasses import dataclass


def math_warpgroups(block_m: int) -> int:
    """Math warpgroups of the FP8 kernel: one per 64 rows up to three; block_m 256 runs two (two waves each)."""
    return {64: 1, 128: 2, 192: 3, 256: 2}[block_m]


@dataclass(frozen=True)
class GemmConfig:
    """One FP8 GEMM instantiation and how it is launched.

    Tile: block_m rows x block_n columns per tile, block_k = 128 (one scale group) per pipeline stage; one math
    warpgroup per 64 rows (block_m 64/128/192; two for block_m 256, each computing two 64-row waves) plus one TMA
    producer warpgroup.
    Pipeline: num_stages shared-memory stages (smem_bytes in all); `pipelined` keeps two FP32 partial accumulators so
    the next K block's MMAs overlap the promotion of the current one (needs 1.5 x block_n registers);
    `chunked_store` (block_m 256 only) stores each wave in 128-byte-wide chunks through one small buffer per
    warpgroup, for when full-width buffers would leave fewer than three stages (FP32 output); `narrow_last_n` runs a
    partial last N-block (N not a multiple of block_n) as narrower MMAs from its own B box.
    Launch: a persistent grid of CTAs walking tiles in bands of group_m rows over num_sms SMs; cluster_m = 2 pairs
    vertically adjacent tiles in a 2-CTA cluster that multicasts the shared B tile, cluster_n = 2 (dense, an even
    number of N-blocks) horizontally adjacent ones that multicast A; split_tail / stream_tail (dense,
    exclusive) split the last partial wave's tiles along K (an FP32 workspace); balanced_grid (dense) launches the
    fewest CTAs that keep the wave count, so every CTA runs the same number of tiles.
    """

    block_m: int
    block_n: int
    num_stages: int
    num_sms: int
    group_m: int = 8
    cluster_m: int = 1
    pipelined: bool = False
    block_k: int = 128
    smem_bytes: int = 0
    split_tail: bool = False
    stream_tail: bool = False
    chunked_store: bool = False
    narrow_last_n: bool = True
    balanced_grid: bool = False
    cluster_n: int = 1

    def __post_init__(self) -> None:
        if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2) or self.cluster_m * self.cluster_n > 2:
            raise ValueError(f"GemmConfig: cluster_m ({self.cluster_m}) and cluster_n ({self.cluster_n}) must be 1 or 2, "
                             "at most one of them 2")

    @property
    def num_math_warpgroups(self) -> int:
        return math_warpgroups(self.block_m)

    @property
    def cluster_size(self) -> int:
        """CTAs per cluster."""
        return self.cluster_m * self.cluster_n

    @property
    def num_threads(self) -> int:
        return 128 * (1 + self.num_math_warpgroups)

    def label(self) -> str:
        label = f"bm{self.block_m} bn{self.block_n} st{self.num_stages} gm{self.group_m} cm{self.cluster_m} pp{int(self.pipelined)} sms{self.num_sms}"
        if self.cluster_n != 1:
            label += f" cn{self.cluster_n}"
        if self.chunked_store:
            label += " cs1"
        if self.stream_tail:
            return label + " sk2"
        return label + " sk1" if self.split_tail else label
