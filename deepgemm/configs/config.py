"""Kernel configurations as frozen data."""

from __future__ import annotations

from dataclasses import dataclass


def math_warpgroups(block_m: int) -> int:
    """Math warpgroups of the FP8 kernel: one per 64 rows up to three; block_m 256 runs two (two waves each)."""
    return {64: 1, 128: 2, 192: 3, 256: 2}[block_m]


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and pipeline of one FP8 GEMM instantiation.

    block_m rows x block_n columns per tile, block_k = 128 (one scale group) per pipeline stage;
    one math warpgroup per 64 rows (block_m 64/128/192; two for block_m 256, each computing two 64-row waves) plus one
    TMA producer warpgroup; a persistent grid of CTAs walking
    tiles in bands of group_m (cluster) rows. cluster_m = 2 pairs vertically adjacent tiles in a
    2-CTA cluster that multicasts the shared B tile. pipelined keeps two FP32 partial accumulators so
    the next K block's MMAs overlap the promotion of the current one (needs 1.5 x block_n registers).
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
    split_tail: bool = False  # dense only: split the last partial wave's tiles along K (FP32 workspace)
    # dense only, exclusive with split_tail: where the last wave fills more than half of the grid, each of its
    # tiles runs its first K blocks on its own CTA and its last ones on a CTA the wave would leave idle (FP32
    # workspace, a slot per tail tile); the tuner's choice, never the cost model's
    stream_tail: bool = False
    # block_m 256 only: store each wave in 128-byte-wide chunks through one small buffer per warpgroup
    # (each chunk waits for the one before) instead of one full-width buffer per wave; for when those
    # buffers would leave fewer than three stages (FP32 output).
    chunked_store: bool = False

    @property
    def num_math_warpgroups(self) -> int:
        return math_warpgroups(self.block_m)

    @property
    def num_threads(self) -> int:
        return 128 * (1 + self.num_math_warpgroups)

    def label(self) -> str:
        label = f"bm{self.block_m} bn{self.block_n} st{self.num_stages} gm{self.group_m} cm{self.cluster_m} pp{int(self.pipelined)} sms{self.num_sms}"
        if self.chunked_store:
            label += " cs1"
        if self.stream_tail:
            return label + " sk2"
        return label + " sk1" if self.split_tail else label
