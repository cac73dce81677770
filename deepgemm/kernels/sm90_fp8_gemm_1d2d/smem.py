"""Shared-memory layout of the FP8 1D2D kernel, mirrored on the host: bytes per stage, output staging, pipeline depth.

Each function mirrors a constant of impls/sm90_fp8_gemm_1d2d_config.cuh; the rendered source static_asserts that both
sides agree on the total (Kernel::kSmemBytes).
"""

from __future__ import annotations

from deepgemm.kernels.common.hopper import SMEM_CAPACITY
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import math_warpgroups
from deepgemm.utils import align_up, ceil_div

MAX_STAGES = 32


def output_tile_bytes(block_n: int, out_elem_bytes: int) -> int:
    """One warpgroup's 64-row output staging buffer; mirrors WarpgroupTileStore::kBytes (store_fragment.cuh)."""
    row_bytes = block_n * out_elem_bytes
    tail = row_bytes % 128
    offset_64 = (row_bytes // 128) * 64 * 128
    offset_32 = offset_64 + (64 * 64 if tail & 64 else 0)
    offset_16 = align_up(offset_32 + (64 * 32 if tail & 32 else 0), 1024)
    return align_up(offset_16 + (64 * 16 if tail & 16 else 0), 1024)


def store_block_n(block_n: int, out_elem_bytes: int, chunked_store: bool) -> int:
    """Columns per epilogue store; mirrors kStoreN: chunked stores are 128 bytes wide."""
    return min(block_n, 128 // out_elem_bytes) if chunked_store else block_n


def chunked_store_for(block_m: int, block_n: int, k: int, out_elem_bytes: int) -> bool:
    """block_m 256 stores each wave from its own full-width buffer (a tile's stores never wait for each
    other) unless those buffers leave fewer than three stages (FP32 output): then in 128-byte chunks."""
    return block_m == 256 and max_stages(block_m, block_n, k, out_elem_bytes, chunked_store=False) < 3


def fp8_gemm_smem_bytes(block_m: int, block_n: int, num_stages: int, k: int, out_elem_bytes: int,
                        chunked_store: bool | None = None) -> int:
    """Shared memory the kernel uses; mirrors the layout in sm90_fp8_gemm_1d2d.cuh (chunked_store None:
    the layout make_config picks)."""
    if chunked_store is None:
        chunked_store = chunked_store_for(block_m, block_n, k, out_elem_bytes)
    warpgroups = math_warpgroups(block_m)
    stage = block_m * 128 + block_n * 128 + block_m * 4
    scale_rows = 1 if 128 % block_n == 0 else 2
    store_buffers = 1 if chunked_store else block_m // (64 * warpgroups)  # one per wave
    d_per_wg = store_buffers * output_tile_bytes(store_block_n(block_n, out_elem_bytes, chunked_store), out_elem_bytes)
    tile_slot = align_up(64 + scale_rows * ceil_div(k, 128) * 4, 128)  # 64-byte tile header, then sfb
    # stages, output buffers, two tile slots, split-tail flags (16 bytes), ring and tile-slot barriers
    return num_stages * stage + warpgroups * d_per_wg + 2 * tile_slot + 16 + 2 * num_stages * 8 + 2 * 2 * 8


def max_stages(block_m: int, block_n: int, k: int, out_elem_bytes: int, chunked_store: bool | None = None) -> int:
    if chunked_store is None:
        chunked_store = chunked_store_for(block_m, block_n, k, out_elem_bytes)
    stages = 0
    while (stages < MAX_STAGES and
           fp8_gemm_smem_bytes(block_m, block_n, stages + 1, k, out_elem_bytes, chunked_store) <= SMEM_CAPACITY):
        stages += 1
    return stages

