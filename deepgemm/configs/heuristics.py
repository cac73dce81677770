"""Closed-form config choice for the FP8 GEMM: a small cost model a human can audit.

For each candidate (block_m, block_n) the model estimates
    time = max(waves * tile_time, hbm_bytes / hbm_bandwidth)
where waves = ceil(tiles / num_sms) and tile_time = max(MMA time, time to stream the tile's
A and B rows from L2 into one SM). Small block_n pays a per-instruction overhead in the MMA
term. The fastest estimate wins; ties go to fewer tiles (less redundant operand traffic).
The pipeline depth is the most stages that fit in shared memory.
"""

from __future__ import annotations

import math
import os

from deepgemm.configs.config import GemmConfig
from deepgemm.utils import align_up, ceil_div

SMEM_CAPACITY = 232_448  # bytes of dynamic shared memory a CTA may use on sm_90
MAX_STAGES = 32

# Machine model (H100/H200 SXM), used only to rank candidates.
FP8_DENSE_FLOPS = 1.98e15
HBM_BYTES_PER_S = 4.0e12
L2_TO_SM_BYTES_PER_S = 1.0e11  # one SM's share of L2 read bandwidth
MMA_OVERHEAD_COLUMNS = 24  # wgmma issue overhead, in equivalent N columns
# Share of time the tensor cores work when promotion is not pipelined (measured: ~58% tensor-pipe
# activity with two warpgroups at bm128 bn160; one warpgroup cannot overlap at all).
UNPIPELINED_MMA_SHARE = {64: 0.55, 128: 0.7}
PIPELINED_MMA_SHARE = {64: 0.7, 128: 0.9}
MAX_PIPELINED_BLOCK_N = 128  # 3 x block_n/2 accumulator registers must fit next to ~40 others


def output_tile_bytes(block_n: int, out_elem_bytes: int) -> int:
    """One warpgroup's 64-row output staging buffer; mirrors WarpgroupTileStore::kBytes (store_fragment.cuh)."""
    row_bytes = block_n * out_elem_bytes
    tail = row_bytes % 128
    offset_64 = (row_bytes // 128) * 64 * 128
    offset_32 = offset_64 + (64 * 64 if tail & 64 else 0)
    offset_16 = align_up(offset_32 + (64 * 32 if tail & 32 else 0), 1024)
    return align_up(offset_16 + (64 * 16 if tail & 16 else 0), 1024)


def fp8_gemm_smem_bytes(block_m: int, block_n: int, num_stages: int, k: int, out_elem_bytes: int) -> int:
    """Shared memory the kernel uses; mirrors the layout in sm90_fp8_gemm_1d2d.cuh."""
    warpgroups = block_m // 64
    stage = block_m * 128 + block_n * 128 + block_m * 4
    scale_rows = 1 if 128 % block_n == 0 else 2
    d_per_wg = output_tile_bytes(block_n, out_elem_bytes)
    sfb_per_wg = align_up(scale_rows * ceil_div(k, 128) * 4, 128)
    return num_stages * stage + warpgroups * (d_per_wg + sfb_per_wg) + 2 * num_stages * 8


def max_stages(block_m: int, block_n: int, k: int, out_elem_bytes: int) -> int:
    stages = 0
    while stages < MAX_STAGES and fp8_gemm_smem_bytes(block_m, block_n, stages + 1, k, out_elem_bytes) <= SMEM_CAPACITY:
        stages += 1
    return stages


def max_block_n(block_m: int) -> int:
    """Widest tile whose two FP32 accumulators (block_n registers per thread) fit the register budget."""
    return 192


MIN_M_BLOCKS_FOR_CLUSTER = 4  # measured: with 2 M-blocks the cross-CTA handshake costs more than it saves


def cluster_m_for(m: int, block_m: int, block_n: int, num_sms: int) -> int:
    """Pair vertically adjacent tiles (B multicast) when M is large enough for L2 traffic to matter.

    DEEPGEMM_CLUSTER_M=1|2 overrides the choice where the tile allows it (for experiments).
    """
    allowed = block_n % 16 == 0 and num_sms % 2 == 0
    forced = os.environ.get("DEEPGEMM_CLUSTER_M")
    if forced in ("1", "2"):
        return 2 if forced == "2" and allowed else 1
    return 2 if allowed and ceil_div(m, block_m) >= MIN_M_BLOCKS_FOR_CLUSTER else 1


def pipelined_for(block_n: int) -> bool:
    return block_n <= MAX_PIPELINED_BLOCK_N


def estimate_seconds(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int, out_elem_bytes: int) -> float:
    k_padded = align_up(max(k, 1), 128)
    cluster_m = cluster_m_for(m, block_m, block_n, num_sms)
    tiles = align_up(ceil_div(m, block_m), cluster_m) * ceil_div(n, block_n)
    waves = ceil_div(tiles, num_sms)
    mma_efficiency = block_n / (block_n + MMA_OVERHEAD_COLUMNS)
    shares = PIPELINED_MMA_SHARE if pipelined_for(block_n) else UNPIPELINED_MMA_SHARE
    mma_efficiency *= shares[block_m]
    mma = 2 * block_m * block_n * k_padded / (FP8_DENSE_FLOPS / num_sms * mma_efficiency)
    stream = (block_m + block_n / cluster_m) * k_padded / L2_TO_SM_BYTES_PER_S
    tile_time = max(mma, stream)
    hbm_bytes = m * k + n * k + m * n * out_elem_bytes
    return max(waves * tile_time, hbm_bytes / HBM_BYTES_PER_S)


def spans_at_most_two_scale_blocks(block_n: int) -> bool:
    """A tile starting at a multiple of block_n sits at most 128 - gcd(block_n, 128) into its scale block."""
    return 128 - math.gcd(block_n, 128) + block_n <= 256


def candidate_tiles(m: int, n: int) -> list[tuple[int, int]]:
    block_ms = [64] if m <= 64 else [64, 128]
    widest_useful = max(align_up(n, 8), 16)
    return [
        (bm, bn)
        for bm in block_ms
        for bn in range(8, max_block_n(bm) + 1, 8)
        if bn <= widest_useful and spans_at_most_two_scale_blocks(bn)
    ]


def choose_fp8_gemm_config(m: int, n: int, k: int, num_sms: int, out_elem_bytes: int = 2) -> GemmConfig:
    """Pick block sizes and stages for D[m, n] = A[m, k] B[n, k]^T on `num_sms` SMs."""
    if min(m, n, k) <= 0 or num_sms <= 0:
        raise ValueError(f"choose_fp8_gemm_config needs positive m, n, k, num_sms; got {m}, {n}, {k}, {num_sms}")
    best: tuple[float, int, int, int] | None = None
    for block_m, block_n in candidate_tiles(m, n):
        if max_stages(block_m, block_n, k, out_elem_bytes) < 2:
            continue
        seconds = estimate_seconds(m, n, k, block_m, block_n, num_sms, out_elem_bytes)
        tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
        key = (seconds * (1 - 1e-9), tiles, block_m, block_n)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None, "no FP8 GEMM tile fits in shared memory"
    _, _, block_m, block_n = best
    stages = max_stages(block_m, block_n, k, out_elem_bytes)
    return GemmConfig(
        block_m=block_m,
        block_n=block_n,
        num_stages=stages,
        num_sms=num_sms,
        cluster_m=cluster_m_for(m, block_m, block_n, num_sms),
        pipelined=pipelined_for(block_n),
        smem_bytes=fp8_gemm_smem_bytes(block_m, block_n, stages, k, out_elem_bytes),
    )
