"""Tile choice for the BF16 GEMM from a small cost model of the H100/H200 (derived for 16-bit operands).

Per SM and clock the tensor cores do 4096 BF16 FLOPs (half the FP8 rate) and shared memory feeds 128 bytes; each
16-deep wgmma step of a 64-row warpgroup reads its A rows and the whole B tile, so a tile's step costs
max(math, shared-memory) cycles. Operand traffic is 2 bytes per element (twice FP8's), so memory-bound shapes need
every SM pulling: the model charges DRAM at a sustained rate and, per SM, the operand bytes its tiles load. The
estimate is max(compute, DRAM, per-SM load) plus a per-tile epilogue cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepgemm.kernels.common.hopper import SMEM_CAPACITY
from deepgemm.kernels.sm90_bf16_gemm.config import ATOM, BLOCK_K, Bf16GemmConfig, bf16_smem_bytes
from deepgemm.utils import ceil_div

CLOCK_HZ = 1.75e9          # sustained SM clock under tensor-core load
MMA_FLOPS_PER_CLOCK = 4096  # BF16 dense, per SM
SMEM_BYTES_PER_CLOCK = 128
DRAM_BYTES_PER_S = 3.6e12  # sustained HBM3e read+write rate
SM_LOAD_BYTES_PER_S = 110e9  # what one SM's TMA pipeline pulls from L2/DRAM
EPILOGUE_S = 0.6e-6        # per tile: accumulators to shared memory to TMA store, not hidden by the next tile
MIN_STAGES = 3
MAX_STAGES = 16  # memory-bound tiles keep more bytes in flight per SM


@dataclass(frozen=True)
class Bf16Problem:
    """One GEMM as the tile choice sees it; grouped kinds are `groups` GEMMs of m x n x k each (m: rows per expert,
    or M for k-grouped; k: K, or the tokens per group for k-grouped)."""

    m: int
    n: int
    k: int
    a_mn_major: bool
    b_mn_major: bool
    out_bytes: int
    addend_bytes: int  # 0: no C
    num_sms: int
    groups: int = 1


def block_n_candidates(problem: Bf16Problem) -> list[int]:
    step = ATOM if problem.b_mn_major else 16
    return [bn for bn in range(step, 257, step)]


def stages_for(block_m: int, block_n: int, out_bytes: int) -> int:
    stages = 0
    while stages < MAX_STAGES and bf16_smem_bytes(block_m, block_n, stages + 1, out_bytes) <= SMEM_CAPACITY:
        stages += 1
    return stages


def estimate_seconds(problem: Bf16Problem, block_m: int, block_n: int) -> float:
    p = problem
    tiles = p.groups * ceil_div(p.m, block_m) * ceil_div(p.n, block_n)
    ctas = min(p.num_sms, tiles)
    tiles_per_sm = ceil_div(tiles, ctas)
    k_steps = ceil_div(p.k, BLOCK_K) * (BLOCK_K // 16)
    warpgroups = block_m // 64
    math = warpgroups * 64 * block_n * 16 * 2 / MMA_FLOPS_PER_CLOCK
    smem = warpgroups * (64 + block_n) * 16 * 2 / SMEM_BYTES_PER_CLOCK
    compute = tiles_per_sm * k_steps * max(math, smem) * 1.08 / CLOCK_HZ
    padded_k = ceil_div(p.k, BLOCK_K) * BLOCK_K
    per_sm_load = tiles_per_sm * (block_m + block_n) * padded_k * 2 / SM_LOAD_BYTES_PER_S
    dram = p.groups * ((p.m + p.n) * p.k * 2 + p.m * p.n * (p.out_bytes + p.addend_bytes)) / DRAM_BYTES_PER_S
    return max(compute, per_sm_load, dram) + tiles_per_sm * EPILOGUE_S


def group_rows_for(m_blocks: int, n_blocks: int, num_sms: int) -> int:
    """Raster band height: enough rows that a wave of CTAs covers a roughly square patch of tiles (A and B reuse)."""
    if m_blocks <= 1 or n_blocks <= 1:
        return 1
    rows = 16
    while rows > 1 and rows * min(n_blocks, max(1, num_sms // rows)) > 2 * num_sms:
        rows //= 2
    return min(rows, m_blocks)


def tile_allowed(problem: Bf16Problem, block_m: int, block_n: int) -> bool:
    """Whether (block_m, block_n) is a tile the kernel compiles for this problem (a tuned entry is re-checked here)."""
    step = ATOM if problem.b_mn_major else 16
    return (block_m in (64, 128) and block_n % step == 0 and step <= block_n <= 256
            and stages_for(block_m, block_n, problem.out_bytes) >= MIN_STAGES)


def make_config(problem: Bf16Problem, block_m: int, block_n: int) -> Bf16GemmConfig:
    """The full config of a tile: as many stages as fit, the raster band for this grid (dense only: the grouped
    kinds walk their own tile order)."""
    group = 1 if problem.groups > 1 else group_rows_for(ceil_div(problem.m, block_m), ceil_div(problem.n, block_n),
                                                        problem.num_sms)
    return Bf16GemmConfig(block_m, block_n, stages_for(block_m, block_n, problem.out_bytes), group, problem.num_sms)


def ranked_configs(problem: Bf16Problem) -> list[tuple[float, Bf16GemmConfig]]:
    """Every allowed tile with the model's estimate, cheapest first (within 0.1%: the larger tile first)."""
    ranked: list[tuple[float, int, Bf16GemmConfig]] = []
    for block_m in (64, 128):
        if block_m == 128 and problem.m <= 64:
            continue
        for block_n in block_n_candidates(problem):
            if block_n > max(problem.n, 8) + (ATOM if problem.b_mn_major else 16) - 1:
                continue
            if not tile_allowed(problem, block_m, block_n):
                continue
            seconds = estimate_seconds(problem, block_m, block_n)
            ranked.append((seconds * 0.999, -block_m * block_n, make_config(problem, block_m, block_n)))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [(seconds / 0.999, config) for seconds, _, config in ranked]


def choose_config(problem: Bf16Problem) -> Bf16GemmConfig:
    """The cheapest (block_m, block_n) by the model, with as many stages as shared memory holds (ties: larger tiles)."""
    ranked = ranked_configs(problem)
    if not ranked:
        raise ValueError(f"no BF16 tile fits shared memory for {problem}")
    return ranked[0][1]
