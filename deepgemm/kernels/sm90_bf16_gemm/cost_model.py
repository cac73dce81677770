"""Tile choice for the BF16 GEMM from a small cost model of the H100/H200 (derived for 16-bit operands).

Per SM and clock the tensor cores do 4096 BF16 FLOPs (half the FP8 rate) and shared memory feeds 128 bytes; each
16-deep wgmma step of a 64-row warpgroup reads its A rows and the whole B tile, so a tile's step costs
max(math, shared-memory) cycles. Operand traffic is 2 bytes per element (twice FP8's), so memory-bound shapes need
every SM pulling: the model charges DRAM at a sustained rate, per SM the operand bytes its tiles load, and over all
SMs the bytes every tile reads from L2 (narrow tiles re-read more). The estimate is max(compute, DRAM, per-SM load,
L2) plus a per-tile epilogue cost; at K <= 2048 the dense 176-, 224- and 240-wide tiles' compute carries a measured
share (SHORT_K_SLOW_WIDTH_SHARE).

Dense decode sizes (M <= DECODE_MAX_M): most tiles tie at the DRAM bound; ties go to a grid that keeps nearly every
SM pulling (decode_tie_order, DECODE_FULL_FILL), else to the larger tile.

Split-K (dense decode sizes, decode_split): where the pick is a narrow tile (it fills the SMs by re-reading A once
per N-block) or leaves three quarters of the SMs idle, a 64-wide (or the same) tile with its K cut into ranges on
the idle SMs ran faster on the H200; elsewhere the plain pick did (2026-12-02, dev/bench_bf16_split.py). Where A is
K-major and the plain pick's grid keeps DECODE_FULL_FILL of the SMs busy (64 x 32 on 128 tiles at N = 4096), the plain
pick stays: its last M-block is loaded in a box of M's rows, and it ran 2-4% ahead of the split (2026-12-06).
"""

from __future__ import annotations

from dataclasses import dataclass

from deepgemm.kernels.common.grid import balanced_grid_applies
from deepgemm.kernels.common.hopper import SMEM_CAPACITY
from deepgemm.kernels.common.split_scratch import split_tail_ranges
from deepgemm.kernels.sm90_bf16_gemm.config import ATOM, BLOCK_K, Bf16GemmConfig, bf16_smem_bytes, store_chunk_columns
from deepgemm.utils import ceil_div

CLOCK_HZ = 1.75e9          # sustained SM clock under tensor-core load
MMA_FLOPS_PER_CLOCK = 4096  # BF16 dense, per SM
SMEM_BYTES_PER_CLOCK = 128
DRAM_BYTES_PER_S = 3.6e12  # sustained HBM3e read+write rate
SM_LOAD_BYTES_PER_S = 110e9  # what one SM's TMA pipeline pulls from L2/DRAM
# All SMs together: operand bytes the tiles read from L2 (each tile its A and B panels), charged where the grid
# fills every SM. Without it 128 x 128 ranked level with 128 x 256 at large M, where on an H100 it ran 0.63-0.80 of
# it (2026-12-05, dev/bf16_contiguous_tiles.py: dense 34154 x 4096 x 7168 3991.0 against 2772.9 µs). On grids of
# fewer tiles than SMs it moved 256 x 4096 x 7168 from 64 x 128 to 128 x 80, 7% slower there.
L2_BYTES_PER_S = 12e12
EPILOGUE_S = 0.6e-6        # per tile: accumulators to shared memory to TMA store, not hidden by the next tile
# Dense tiles 176, 224 and 240 wide ran slower per column than their neighbours at K <= 2048 (both GPUs,
# 2026-12-06, dev/bench_bf16_split.py, interleaved, calc_diff 1.4e-6): at N = 28672 (whole N-blocks for both)
# 128 x 224 took 5.5% longer than 128 x 256 at K = 512 and 5% longer than 128 x 208 at K = 2048; 128 x 224 picks
# ran 1-8% slower than 256 / 192 / 208 / 160 / 144 in 15 of 17 H100 pairs (4096 x 32768 x 512: 223.0 against
# 209.2 us), 128 x 240 (three stages) 1-16% slower in 9 of 11 H200 pairs, 128 x 176 2-7% slower in 3 pairs at
# K <= 1024 and within 0.8% in 6. The cause is not found: ncu counts the model's tensor-pipe cycles per tile, and
# the idle time between tiles (mostly the epilogue) is what differs. Their compute estimate carries this share there
# (benchmarks/2026-12-06-bf16-short-k.md; docs/performance.md, BF16 levers).
SHORT_K_SLOW_WIDTHS = (176, 224, 240)
SHORT_K_SLOW_WIDTH_SHARE = 1.05
SHORT_K_MAX = 2048
MIN_STAGES = 3
# FP32 output through one whole-tile staging buffer that leaves 3 stages (128 x 192, 128 x 176) ran 13-15% slower
# than 128 x 256 with the chunked epilogue (4 stages) where the model had them level (H200, 2026-12-02, k-grouped
# 4 x ~4096 M = N = 4096: 987.8 vs 857.9 us; 8 x ~4096 M = N = 7168: 6001.9 vs 5305.9; dense FP32 out: the chunked
# 128 x 256 7-18% faster than the best unchunked pick). BF16 output: BF16_CHUNKED_BELOW_STAGES.
FP32_FULL_STAGES = 4
FP32_FEW_STAGES_FACTOR = 1.12
# BF16 output is staged in chunks where the whole tile's buffer leaves fewer stages than this and chunks add one:
# 128 x 256 (64-column chunks) and 128 x 224 (32-column, 64-byte chunks) run 4 stages instead of 3. H100, 2026-12-06:
# 128 x 256, dev/bench_bf16_split.py `,k` interleaved against the 3-stage build, 4096 x 4096 x 7168: 0.5-3.0% faster
# in all ten timings over the four layouts (NT 300.9 -> 293.1 us), the masked N = 4096 MoE cases from 0.96-0.97 to
# 1.02-1.03 of DeepGEMM HEAD; 128 x 224, dev/ab_trees.py against the 3-stage tree, outputs bitwise equal: masked
# N = 7168 K = 2048 1.07-1.14x faster (0.96 -> 1.03-1.09 of DeepGEMM HEAD), NT 8192^3 1.014x, 4096 x 32768 x 512
# level. Narrower chunks lost: 128 x 224 in 56-column chunks (three store pieces of 64 + 32 + 16 bytes, the last
# unswizzled) 21% slower at 4096 x 32768 x 512, 128 x 176 in 16-column chunks level to 1.5% slower. Stages do not
# enter the BF16 estimate, so no pick moves.
BF16_CHUNKED_BELOW_STAGES = 4
BF16_MIN_CHUNK_BYTES = 64  # a BF16 chunk is one store piece of 128 or 64 bytes (a swizzled box), never narrower
MAX_STAGES = 16  # memory-bound tiles keep more bytes in flight per SM
SPLIT_MIN_K_BLOCKS = 8     # split-K: 64-deep K blocks per range at least (the ring's fill is paid per range)
DECODE_MAX_M = 128         # dense M up to this: split-K applies
# H200, NT (ours µs, plain pick -> split-K build): 1 x 2112 x 7168 bn32 30.0 -> bn64 19.7; 64 x 2112 x 7168 bn32
# 20.4 -> bn64 19.1; 128 x 2112 x 7168 bn48 21.4 -> bn64 20.3; 16 x 4096 x 14336 bn48 58.0 -> bn64 44.8. Picks of
# 64+ columns on 45-64 tiles were 2-10% faster unsplit (64 x 4096 x 7168, 64 x 7168 x 2048, 64 x 7168 x 16384).
DECODE_SPLIT_MAX_BLOCK_N = 48  # a plain pick this narrow is widened to DECODE_SPLIT_BLOCK_N and split
DECODE_SPLIT_BLOCK_N = 64
DECODE_SPLIT_MIN_RANGES = 4    # a wider pick is split as it is when it leaves this many SMs per tile
DECODE_SPLIT_TUNER_BLOCK_N = (64, 128)  # split-K widths the tuner times at decode sizes besides the rule's pick
# Decode ties (dense M <= DECODE_MAX_M, plain tiles of equal estimate: mostly the DRAM bound, one tile per SM): a grid
# that keeps nearly every SM pulling beats a larger tile that leaves SMs idle (the larger tile was the tie-break
# before). H100, 2026-12-06, dev/bench_bf16_split.py, interleaved, calc_diff 1.4e-6, µs larger tile -> fullest grid:
# NT 128 x 10240 x 8192 128 x 144 (72 tiles) 73.6 -> 64 x 160 (128) 70.4; 16 x 10240 x 8192 64 x 240 73.5 -> 64 x 80
# 69.3; 128 x 12288 x 4096 128 x 176 50.8 -> 64 x 192 48.5; 128 x 18944 x 3584 128 x 256 62.6 -> 128 x 144 (264 tiles)
# 60.3; 128 x 37888 x 3584 109.0 -> 105.6; 64 x 12288 x 4096 64 x 256 49.7 -> 64 x 96 47.3; 14 of 18 NT / TT pairs
# 1-6% faster, 64 x 37888 x 3584 and 64 x 57344 x 8192 0.6-0.8% slower. Grids of 112 tiles (0.85 of the SMs) went
# both ways: 64 x 64 at 64 x 7168 x 2048 1.5-3.5% faster, at 64 x 7168 x 16384 0.8-1.2% slower in all four layouts;
# they keep the larger tile, as do sparser grids, which lost: 64 x 48 (107 tiles) against 64 x 80 at 64 x 5120 x 27648
# 112.2 against 107.4, 64 x 48 (96 tiles) at 64 x 4608 x 3584 22.2 against 21.7. On 128 tiles 64 x 48 won:
# 64 x 6144 x 4096 28.7 against 64 x 128's 29.4 (TT 28.8 / 29.6).
DECODE_FULL_FILL = 0.9


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
    k_grouped: bool = False  # groups of K ranges into their own [M, N] outputs (tiles walk the dense raster per group)
    m_grouped: bool = False  # groups of rows (contiguous / masked experts), also when there is one group
    contiguous: bool = False  # m_grouped, contiguous layout (m_indices form): tiles walk bands of group_rows M-blocks


def is_dense(problem: Bf16Problem) -> bool:
    """One plain GEMM: not grouped (even a grouped launch of one group) and not k-grouped."""
    return problem.groups == 1 and not problem.k_grouped and not problem.m_grouped


def is_decode(problem: Bf16Problem) -> bool:
    """A dense GEMM of at most DECODE_MAX_M rows: where split-K builds are considered (never a grouped launch, even
    of one group: the grouped kernels have no split-K build)."""
    return is_dense(problem) and problem.m <= DECODE_MAX_M


def block_n_candidates(problem: Bf16Problem) -> list[int]:
    step = ATOM if problem.b_mn_major else 16
    return [bn for bn in range(step, 257, step)]


def stages_for(block_m: int, block_n: int, out_bytes: int, split_k: bool = False, store_n: int = 0) -> int:
    stages = 0
    while (stages < MAX_STAGES
           and bf16_smem_bytes(block_m, block_n, stages + 1, out_bytes, split_k, store_n) <= SMEM_CAPACITY):
        stages += 1
    return stages


def store_n_for(block_m: int, block_n: int, out_bytes: int, split_k: bool = False) -> int:
    """0 (one staging buffer per warpgroup) unless the whole tile's buffer would leave fewer than MIN_STAGES stages
    (FP32 output: 128 x 256 keeps 2) or, with BF16 output and no split, fewer than BF16_CHUNKED_BELOW_STAGES
    (128 x 256 and 128 x 224 keep 3): then chunks through two small buffers where that adds a stage, of 128-byte rows
    (FP32) or 128- or 64-byte rows (BF16, BF16_MIN_CHUNK_BYTES). Other tiles keep the whole buffer, and below
    MIN_STAGES are not allowed."""
    whole = stages_for(block_m, block_n, out_bytes, split_k)
    if whole >= (MIN_STAGES if out_bytes == 4 or split_k else BF16_CHUNKED_BELOW_STAGES):
        return 0
    chunk = store_chunk_columns(block_n, out_bytes)
    if chunk * out_bytes < (128 if out_bytes == 4 else BF16_MIN_CHUNK_BYTES) or chunk >= block_n:
        return 0
    return chunk if stages_for(block_m, block_n, out_bytes, split_k, chunk) > whole else 0


def split_k_ranges(problem: Bf16Problem, block_m: int, block_n: int) -> int:
    """K ranges per tile of a split-K build on all SMs (1: it would not split). Split-K is for dense GEMMs whose
    tiles fill at most half of the SMs (decode sizes), in ranges of at least SPLIT_MIN_K_BLOCKS; mirrors
    SplitTailTileScheduler, which splits a last wave of at most half the grid."""
    p = problem
    tiles = ceil_div(p.m, block_m) * ceil_div(p.n, block_n)
    if not is_decode(p) or 2 * tiles > p.num_sms:
        return 1
    k_blocks = ceil_div(p.k, BLOCK_K)
    ranges = split_tail_ranges(tiles, p.num_sms, k_blocks)
    return ranges if k_blocks >= SPLIT_MIN_K_BLOCKS * ranges else 1


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
    if is_dense(p) and block_m == 128 and block_n in SHORT_K_SLOW_WIDTHS and p.k <= SHORT_K_MAX:
        compute *= SHORT_K_SLOW_WIDTH_SHARE
    padded_k = ceil_div(p.k, BLOCK_K) * BLOCK_K
    tile_bytes = (block_m + block_n) * padded_k * 2  # the A and B panels one tile loads
    per_sm_load = tiles_per_sm * tile_bytes / SM_LOAD_BYTES_PER_S
    dram = p.groups * ((p.m + p.n) * p.k * 2 + p.m * p.n * (p.out_bytes + p.addend_bytes)) / DRAM_BYTES_PER_S
    l2 = tiles * tile_bytes / L2_BYTES_PER_S if tiles >= p.num_sms else 0.0
    seconds = max(compute, per_sm_load, dram, l2) + tiles_per_sm * EPILOGUE_S
    if p.out_bytes == 4 and stages_for(block_m, block_n, 4, store_n=store_n_for(block_m, block_n, 4)) < FP32_FULL_STAGES:
        seconds *= FP32_FEW_STAGES_FACTOR
    return seconds


def decode_split(problem: Bf16Problem, larger: Bf16GemmConfig, plain: Bf16GemmConfig) -> Bf16GemmConfig | None:
    """The split-K build that replaces the model's plain pick at a dense decode size, or None (see the module
    docstring): the larger-tile pick (`larger`, which the rule was measured on) widened to 64 columns where it is
    narrow, or split as it is where it leaves 3/4 of the SMs idle; none where A is K-major and the tile
    decode_tie_order runs (`plain`) keeps DECODE_FULL_FILL of the SMs busy (its last M-block's box is M's rows)."""
    if not is_decode(problem):
        return None
    if not problem.a_mn_major and wave_fill(problem, plain.block_m, plain.block_n) >= DECODE_FULL_FILL:
        return None
    block_n = larger.block_n
    if block_n <= DECODE_SPLIT_MAX_BLOCK_N:
        block_n = DECODE_SPLIT_BLOCK_N
        if not tile_allowed(problem, larger.block_m, block_n) or split_k_ranges(problem, larger.block_m, block_n) < 2:
            return None
    elif split_k_ranges(problem, larger.block_m, block_n) < DECODE_SPLIT_MIN_RANGES:
        return None
    return make_config(problem, larger.block_m, block_n, split_k=True)


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
    if not (block_m in (64, 128) and block_n % step == 0 and step <= block_n <= 256):
        return False
    store_n = store_n_for(block_m, block_n, problem.out_bytes)
    return stages_for(block_m, block_n, problem.out_bytes, store_n=store_n) >= MIN_STAGES


def make_config(problem: Bf16Problem, block_m: int, block_n: int, split_k: bool = False) -> Bf16GemmConfig:
    """The full config of a tile: as many stages as fit (wide FP32 tiles with a chunked epilogue, store_n_for), the
    raster band for this grid (dense and each k-grouped group; the M-grouped kinds walk their own tile order), and a
    balanced grid for dense unsplit GEMMs where balanced_grid_applies (common.grid)."""
    banded = problem.groups == 1 or problem.k_grouped or problem.contiguous
    group = group_rows_for(ceil_div(problem.m, block_m), ceil_div(problem.n, block_n), problem.num_sms) if banded else 1
    store_n = store_n_for(block_m, block_n, problem.out_bytes, split_k)
    stages = stages_for(block_m, block_n, problem.out_bytes, split_k, store_n)
    balanced = is_dense(problem) and not split_k and balanced_grid_applies(problem.k)
    return Bf16GemmConfig(block_m, block_n, stages, group, problem.num_sms, split_k, store_n, balanced)


def wave_fill(problem: Bf16Problem, block_m: int, block_n: int) -> float:
    """The share of the SM slots that a tile grid's waves keep busy: tiles / (waves x SMs)."""
    tiles = problem.groups * ceil_div(problem.m, block_m) * ceil_div(problem.n, block_n)
    return tiles / (ceil_div(tiles, problem.num_sms) * problem.num_sms)


def decode_tie_order(problem: Bf16Problem, block_m: int, block_n: int) -> tuple[int, float, int, int]:
    """How plain tiles of equal estimate rank at dense decode sizes (smaller first), where most tiles tie at the DRAM
    bound: tiles whose waves keep DECODE_FULL_FILL of the SM slots busy come first, the fullest first, then block_m
    64, then the larger tile; every other tile after them, the larger first."""
    fill = wave_fill(problem, block_m, block_n)
    if fill >= DECODE_FULL_FILL:
        return (0, -round(fill, 6), block_m, -block_m * block_n)
    return (1, 0.0, 0, -block_m * block_n)


def ranked_configs(problem: Bf16Problem) -> list[tuple[float, Bf16GemmConfig]]:
    """Every allowed tile with the model's estimate, cheapest first (equal estimates: the larger tile first, or at dense
    decode sizes decode_tie_order); at dense decode sizes the split-K build of decode_split ahead of them and other
    split widths after the plain pick."""
    ranked: list[tuple[float, Bf16GemmConfig]] = []
    for block_m in (64, 128):
        if block_m == 128 and problem.m <= 64:
            continue
        for block_n in block_n_candidates(problem):
            if block_n > max(problem.n, 8) + (ATOM if problem.b_mn_major else 16) - 1:
                continue
            if not tile_allowed(problem, block_m, block_n):
                continue
            seconds = estimate_seconds(problem, block_m, block_n)
            ranked.append((seconds, make_config(problem, block_m, block_n)))
    ranked.sort(key=lambda item: (item[0], -item[1].block_m * item[1].block_n))
    if not ranked or not is_decode(problem):
        return ranked
    # Split-K builds at the estimate of the larger-tile pick, which decode_split's rule was measured on (a split
    # replaces it; the tuner times the other widths right after the plain pick: a 128-wide split won at
    # 1 x 4096 x 7168). Without a split, the plain tiles in decode_tie_order.
    larger = ranked[0][1]
    others = [make_config(problem, larger.block_m, block_n, split_k=True) for block_n in DECODE_SPLIT_TUNER_BLOCK_N
              if tile_allowed(problem, larger.block_m, block_n) and split_k_ranges(problem, larger.block_m, block_n) > 1]
    ranked.sort(key=lambda item: (item[0], *decode_tie_order(problem, item[1].block_m, item[1].block_n)))
    split = decode_split(problem, larger, ranked[0][1])
    ranked[1:1] = [(ranked[0][0], config) for config in others if config != split]
    if split is not None:
        ranked.insert(0, (ranked[0][0], split))
    return ranked


def choose_config(problem: Bf16Problem) -> Bf16GemmConfig:
    """The cheapest (block_m, block_n) by the model, with as many stages as shared memory holds (ties: ranked_configs)."""
    ranked = ranked_configs(problem)
    if not ranked:
        raise ValueError(f"no BF16 tile fits shared memory for {problem}")
    return ranked[0][1]
