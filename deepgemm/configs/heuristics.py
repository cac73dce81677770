"""Closed-form config choice for the FP8 GEMM: a small cost model a human can audit.

For each candidate (block_m, block_n) the model estimates
    time = max(waves * tile_time, hbm_bytes / hbm_bandwidth)
where waves = ceil(tiles / num_sms) and tile_time = max(MMA time, time to stream the tile's
A and B rows from L2 into one SM), plus above decode sizes a fixed cost per tile. Small block_n
pays a per-instruction overhead in the MMA term. Decode sizes (M <= 128) and larger M have their
own constants, each fitted to H200 timings of that regime. The fastest estimate wins; ties go to
fewer tiles (less redundant operand traffic). The pipeline depth is the most stages that fit in
shared memory.
"""

from __future__ import annotations

import math
import os

from deepgemm.configs.config import GemmConfig, math_warpgroups
from deepgemm.errors import UnsupportedError
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
# block_m 256 (two waves per warpgroup, unpipelined) streams 25% fewer operand bytes per FLOP than
# 128 x 128; measured 2-9% faster than pipelined bm128 bn128 on five of six M = 4096 H200 shapes.
# block_m 192 (three math warpgroups, 160 registers each): measured ~10% slower per row than block_m 256
# on 4096x7168x16384 (848 us for 10 waves vs 722 us for 7). On 4096x2112x7168 (session 6, with the tile
# loader) it runs 115.8 us against 105.2 for 128 x 192 tiles (352 tiles, 2.7 waves) and 122.5 for
# 128 x 128: its share is fitted to that (0.86 before, when a code-layout effect made it 109 us).
UNPIPELINED_MMA_SHARE = {64: 0.4, 128: 0.8, 192: 0.77, 256: 0.95}
PIPELINED_MMA_SHARE = {64: 0.7, 128: 0.9}
# Tiles whose block_n does not divide 128 straddle two sfb blocks: per-column scale selects in the
# promotion. Fitted on the H200 sweep (benchmarks/h200-tune-sweep.json): such tiles ran ~30% slower.
# (Since session 5, block_n 96/160/192 pick each column's scale at compile time: the decode constants keep
# the penalty for them, the prefill ones below apply it only to run-time straddles, which still measured slow:
# 128 x 112 ran 256x7168x16384 in 70.7 us against 58.6 for 128 x 128, session 11.)
STRADDLE_SHARE = 0.7
MAX_PIPELINED_BLOCK_N = 128  # 3 x block_n/2 accumulator registers must fit next to ~40 others

# Above decode sizes (M > DECODE_MAX_M) the same terms are fitted to measurements instead
# (benchmarks/h200-mid-m-tune.md: 7 tiles x 42 shapes, M = 160-3072 on the six DeepSeek-V3 (N, K) pairs, H200):
# t = c0 + waves x (K blocks x per-K-block MMA time + per-tile cost), rms error 6% (the decode constants were off by
# 0.6-3x there: they ranked 128 x 192 tiles, a compile-time straddle, 30% too slow, and the picks ran up to 1.4x the
# best measured tile). The launch constant c0 (~6.7 us with the harness's floor) ranks nothing and is left out.
# The decode regime keeps the constants above: its picks were measured with them (sessions 9-10).
DECODE_MAX_M = 128
PREFILL_MMA_OVERHEAD_COLUMNS = 54
PREFILL_PIPELINED_MMA_SHARE = {64: 0.70, 128: 0.99}
# (block_m 64 unpipelined: one warpgroup cannot overlap its promotion; not measured, scaled as in the decode model.)
PREFILL_UNPIPELINED_MMA_SHARE = {64: 0.40, 128: 0.955, 192: 0.87, 256: 1.065}
PREFILL_TILE_SECONDS = 0.68e-6  # per tile: tile start and epilogue ...
# ... and with one or two unpipelined math warpgroups the last K block's MMAs and promotion, which nothing
# overlaps, in K blocks' MMA time (block_m 192's three warpgroups overlap it). 128 x 192 tiles get more: a fit per
# tile type (session 12) put their per-tile cost at 1.6 us against 1.4 in the shared form, and with 2.0 K blocks the
# picks at short K (24576 x 1536 at M = 160-768, 7168 x 2048 at M = 768) move to 128 x 128, which measured 3-5%
# faster (scripts/model_ab.py); on the 42 tuned shapes the picks then run 0.4% behind the best measured tile on
# average (max 4.7%) against 0.9% (max 6.5%). Applied to 128 x 160 as well, it lost 4-11% at K = 7168-8192.
PREFILL_EXPOSED_K_BLOCKS = 1.25
PREFILL_EXPOSED_K_BLOCKS_WIDE = 2.0  # block_n >= PREFILL_WIDE_BLOCK_N with block_m 128
PREFILL_WIDE_BLOCK_N = 192
# Grouped layouts keep 1.25 for those tiles: their picks were measured with it (v35's contiguous 128 x 192, the
# masked tile A/B of session 12), and 2.0 would change 161 of 2520 grouped grid picks, none of them timed, among them
# masked groups at N = 7168, K = 2048 to 128 x 96, which ran 10-28% slower than 128 x 128 on the issue-5 masked cases.
GROUPED_EXPOSED_K_BLOCKS_WIDE = PREFILL_EXPOSED_K_BLOCKS


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


def max_block_n(block_m: int) -> int:
    """Widest tile whose two FP32 accumulators (block_n registers per thread) fit the register budget."""
    return 192


def cluster_m_for(m: int, block_m: int, block_n: int, num_sms: int) -> int:
    """1 by default: the 2-CTA B multicast measured slower than no cluster on 17 of 18 H200 shapes
    (benchmarks/h200-tune-sweep.json; e.g. 4096x7168x16384 962 vs 841 us), so it is opt-in.

    DEEPGEMM_CLUSTER_M=2 enables it where the tile allows it (block_n % 16 == 0, two or more M-blocks).
    """
    return 2 if clusters_allowed(m, block_m, block_n, num_sms) and os.environ.get("DEEPGEMM_CLUSTER_M") == "2" else 1


def clusters_allowed(m: int, block_m: int, block_n: int, num_sms: int) -> bool:
    """Whether a tile may run as 2-CTA clusters: halves of B for multicast (block_n % 16 == 0), pairs of SMs,
    two or more M-blocks, and not block_m 192 (its three math warpgroups leave no registers for it)."""
    return block_n % 16 == 0 and num_sms % 2 == 0 and ceil_div(m, block_m) >= 2 and block_m != 192


def pipelined_for(block_m: int, block_n: int) -> bool:
    """Two partial accumulators fit for block_n <= 128; block_m 256 already holds two waves of results and
    block_m 192's three math warpgroups get 160 registers each."""
    return block_m not in (192, 256) and block_n <= MAX_PIPELINED_BLOCK_N


def estimate_seconds(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int, out_elem_bytes: int,
                     wide_tail_k_blocks: float = PREFILL_EXPOSED_K_BLOCKS_WIDE) -> float:
    """Estimated run time: the slower of the tile schedule and the HBM floor."""
    return max(tile_schedule_seconds(m, n, k, block_m, block_n, num_sms, wide_tail_k_blocks),
               hbm_seconds(m, n, k, out_elem_bytes))


def hbm_seconds(m: int, n: int, k: int, out_elem_bytes: int) -> float:
    return (m * k + n * k + m * n * out_elem_bytes) / HBM_BYTES_PER_S


def tile_schedule_seconds(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int,
                          wide_tail_k_blocks: float = PREFILL_EXPOSED_K_BLOCKS_WIDE) -> float:
    """waves x per-tile time, the per-tile time being the slower of MMA and streaming operands from L2, plus (above
    decode sizes) a fixed cost per tile."""
    k_padded = align_up(max(k, 1), 128)
    cluster_m = cluster_m_for(m, block_m, block_n, num_sms)
    tiles = align_up(ceil_div(m, block_m), cluster_m) * ceil_div(n, block_n)
    waves = ceil_div(tiles, num_sms)
    mma_per_k_block = 2 * block_m * block_n * 128 / (FP8_DENSE_FLOPS / num_sms * mma_efficiency(m, block_m, block_n))
    mma = mma_per_k_block * k_padded / 128
    stream = (block_m + block_n / cluster_m) * k_padded / L2_TO_SM_BYTES_PER_S
    tile_fixed = 0.0
    if m > DECODE_MAX_M:
        exposed_tail = not pipelined_for(block_m, block_n) and math_warpgroups(block_m) < 3
        exposed = wide_tail_k_blocks if block_m == 128 and block_n >= PREFILL_WIDE_BLOCK_N else PREFILL_EXPOSED_K_BLOCKS
        tile_fixed = PREFILL_TILE_SECONDS + (exposed * mma_per_k_block if exposed_tail else 0.0)
    return waves * (max(mma, stream) + tile_fixed)


def mma_efficiency(m: int, block_m: int, block_n: int) -> float:
    """Share of the tensor peak a tile's K loop runs at: the decode constants up to DECODE_MAX_M rows, the fitted
    prefill ones above."""
    pipelined = pipelined_for(block_m, block_n)
    if m <= DECODE_MAX_M:
        efficiency = block_n / (block_n + MMA_OVERHEAD_COLUMNS)
        efficiency *= (PIPELINED_MMA_SHARE if pipelined else UNPIPELINED_MMA_SHARE)[block_m]
        return efficiency * (STRADDLE_SHARE if 128 % block_n != 0 else 1.0)
    efficiency = block_n / (block_n + PREFILL_MMA_OVERHEAD_COLUMNS)
    efficiency *= (PREFILL_PIPELINED_MMA_SHARE if pipelined else PREFILL_UNPIPELINED_MMA_SHARE)[block_m]
    return efficiency * (1.0 if static_straddle(block_n) else STRADDLE_SHARE)


def static_straddle(block_n: int) -> bool:
    """Whether the kernel resolves a tile's switch to the next 128-column scale block at compile time (no straddle,
    or at most four possible switch columns); mirrors kStaticStraddle. Other widths select scales per 8 columns
    at run time."""
    return 128 % block_n == 0 or 128 // math.gcd(block_n, 128) <= 4


def spans_at_most_two_scale_blocks(block_n: int) -> bool:
    """A tile starting at a multiple of block_n sits at most 128 - gcd(block_n, 128) into its scale block."""
    return 128 - math.gcd(block_n, 128) + block_n <= 256


MIN_M_FOR_BLOCK_M_256 = 512
# Contiguous grouped GEMMs: a 256-row block whose halves belong to two experts runs as two 128-row
# half tiles (each still loading 256 rows of A), so block_m 256 needs long expert segments. With at
# least 1024 rows per expert on average at most one block in four is split.
MIN_ROWS_PER_GROUP_FOR_BLOCK_M_256 = 1024
# Masked grouped GEMMs: block_m 256 measured +4% on the K = 7168 cases (1 x ~1024 and 2 x ~512 rows,
# N = 4096) and -11% / -24% on the K = 2048 ones (N = 7168): with short K the unpipelined 256-row tiles,
# often half empty at the end of a group, lose to pipelined 128-row tiles.
MIN_K_FOR_MASKED_BLOCK_M_256 = 4096


# Masked decode-sized groups (expected_m <= 128) are weight-bound, and a group whose rows spill past one
# M-block streams its weights again for the spill. Rows per group vary around expected_m (MoE routing),
# so those tiles are sized for expected_m plus a quarter: 8 x ~64 tokens (45-83 rows) then use 128-row
# tiles, each group's weights read once.
MASKED_DECODE_MAX_EXPECTED_M = 128


def masked_config_m(expected_m: int, max_m: int) -> int:
    """The M the masked kernel's tile is chosen for (see MASKED_DECODE_MAX_EXPECTED_M)."""
    m = max(min(expected_m, max_m), 1)
    return min(m + m // 4, max_m) if m <= MASKED_DECODE_MAX_EXPECTED_M else m


def contiguous_allows_block_m_256(m_total: int, groups: int) -> bool:
    """block_m 256 for the contiguous MoE layout only when the average expert segment is long."""
    return m_total >= MIN_M_FOR_BLOCK_M_256 and m_total >= MIN_ROWS_PER_GROUP_FOR_BLOCK_M_256 * max(groups, 1)


def max_block_n_for(n: int, cap: int) -> int:
    """Widest block_n <= cap that covers N columns without waste and never spans three scale blocks."""
    limit = min(cap, max(16, -(-n // 8) * 8))
    return max(bn for bn in range(8, limit + 1, 8) if spans_at_most_two_scale_blocks(bn))


# Masked grouped GEMMs: the model sees N x groups columns (the same tile count and weight bytes as one GEMM that
# wide) with block_m 256 (block_n 128) only when one group's N fills it. Tiles stay at most MASKED_MAX_BLOCK_N wide:
# the groups' rows vary around expected_m, so the wave count a wider tile would be chosen for is a guess (128 x 160
# measured 13% slower on 2 x ~512 rows at N = 7168, K = 2048, and 1.5-3% faster on 1 x ~1024 and 4 x ~256).
MASKED_MAX_BLOCK_N = 128


def masked_tile(expected_rows: int, groups: int, n: int, k: int, num_sms: int, out_elem_bytes: int) -> tuple[int, int]:
    """(block_m, block_n) for masked groups sized for `expected_rows` each: the model's pick, its width capped at
    MASKED_MAX_BLOCK_N and narrowed to cover N without waste (block_m 256 keeps its 128 columns). The cap applies
    after ranking, so where the model preferred a wider tile the capped one was not itself ranked (e.g. 2 x ~512
    rows at N = K = 7168: 128 x 160 becomes 128 x 128, which the model estimates 7% slower than 256 x 128); ranking
    only narrow tiles changes the tiles of other layouts too (1 x ~1100 rows, N = 4096: 128 x 96), not yet run on a
    GPU."""
    base = choose_fp8_gemm_config(max(expected_rows, 1), n * groups, k, num_sms, out_elem_bytes,
                                  allow_block_m_256=masked_allows_block_m_256(k) and n >= 128,
                                  wide_tail_k_blocks=GROUPED_EXPOSED_K_BLOCKS_WIDE, wide_tile_share=1.0)
    if base.block_m == 256:
        return 256, base.block_n
    return base.block_m, max_block_n_for(n, min(base.block_n, MASKED_MAX_BLOCK_N))


# Contiguous grouped GEMMs (session 11, scripts/grouped_tile_ab.py: the four issue-5 cases, tiles timed interleaved,
# three runs): 128 x 192 tiles ran 6-9% faster than block_m 256 and 5-9% faster than 128 x 128, with bitwise the same
# output (e.g. 4 x ~8538 rows, N = 4096, K = 7168: 1673.7 against 1790.1 us; 8 x ~4780, N = 7168, K = 2048: 957.3
# against 1054.5), where the fitted model ranks them level with the others. So for this layout the model's estimate
# of a 128 x 192 tile is scaled by CONTIGUOUS_WIDE_TILE_SHARE before it is compared with the model's pick (wave
# quantization still counts: at 8 x 128 rows, N = 4096, two waves of them lose to one of block_m 256).
CONTIGUOUS_WIDE_TILE = (128, 192)
CONTIGUOUS_WIDE_TILE_SHARE = 0.92


def contiguous_tile(m_total: int, groups: int, n: int, k: int, num_sms: int, out_elem_bytes: int) -> tuple[int, int]:
    """(block_m, block_n) for a contiguous MoE layout of m_total rows in `groups` expert segments: the model's pick
    (block_m 256 only for long segments) or 128 x 192 tiles where their measured advantage makes them faster."""
    m = max(m_total, 1)
    # The dense 128 x 192 rule stays off here (wide_tile_share=1): this layout's own measured rule below decides
    # between the plain pick and 128 x 192 (with it on, the same picks result on a 3600-shape grid, but the two
    # corrections would compound).
    base = choose_fp8_gemm_config(m, n, k, num_sms, out_elem_bytes,
                                  allow_block_m_256=contiguous_allows_block_m_256(m_total, groups),
                                  wide_tail_k_blocks=GROUPED_EXPOSED_K_BLOCKS_WIDE, wide_tile_share=1.0)
    block_m, block_n = CONTIGUOUS_WIDE_TILE
    if m > DECODE_MAX_M and n >= block_n and max_stages(block_m, block_n, k, out_elem_bytes) >= 3:
        tail = GROUPED_EXPOSED_K_BLOCKS_WIDE
        wide = estimate_seconds(m, n, k, block_m, block_n, num_sms, out_elem_bytes, tail) * CONTIGUOUS_WIDE_TILE_SHARE
        if wide < estimate_seconds(m, n, k, base.block_m, base.block_n, num_sms, out_elem_bytes, tail):
            return block_m, block_n
    return base.block_m, base.block_n


def masked_allows_block_m_256(k: int) -> bool:
    """block_m 256 for masked groups only with long K."""
    return k >= MIN_K_FOR_MASKED_BLOCK_M_256


def candidate_tiles(m: int, n: int, allow_block_m_256: bool = True, allow_block_m_192: bool = True) -> list[tuple[int, int]]:
    """Feasible (block_m, block_n): block_m 256 only where allowed (dense; grouped under the rules above)
    with M >= 512, with block_n 128
    (256 x 64 measured slower than 128 x 128 on 4096x2112x7168 although it fills whole waves); block_m 192
    (dense only: grouped layouts align blocks to 128 rows) with M >= 512 and block_n 128."""
    block_ms = [64] if m <= 64 else [64, 128]
    widest_useful = max(align_up(n, 8), 16)
    tiles = [
        (bm, bn)
        for bm in block_ms
        for bn in range(8, max_block_n(bm) + 1, 8)
        if bn <= widest_useful and spans_at_most_two_scale_blocks(bn)
    ]
    if allow_block_m_256 and m >= MIN_M_FOR_BLOCK_M_256:
        tiles += [(256, 128)] if widest_useful >= 128 else []
    if allow_block_m_192 and m >= MIN_M_FOR_BLOCK_M_256 and widest_useful >= 128:
        tiles += [(192, 128)]
    return tiles


# Dense GEMMs with at least this K get a balanced grid (balanced_grid): measured on the H200 0.5-2.4% faster
# on six shapes with K of 1536-16384, 5% slower at K = 512 (4096 x 32768 x 512: 32 waves, 4 tiles in the last).
BALANCED_GRID_MIN_K = 1024


def balanced_grid_applies(k: int) -> bool:
    """Whether a dense GEMM with this K runs on a balanced grid (DEEPGEMM_BALANCED_GRID=0 turns it off)."""
    switch = os.environ.get("DEEPGEMM_BALANCED_GRID", "").strip()
    if switch not in ("", "0", "1"):
        raise ValueError(f"DEEPGEMM_BALANCED_GRID must be 0 or 1, got {switch!r}")
    return switch != "0" and k >= BALANCED_GRID_MIN_K


def balanced_grid(tiles: int, slots: int) -> int:
    """The fewest CTAs that run `tiles` in as many waves as `slots` CTAs would: every CTA then gets the same
    number of tiles (512 tiles on 132 SMs: 128 CTAs of four, not 116 of four and 16 of three). The time in
    waves is unchanged; the SMs left idle leave power to the busy ones (the M = 4096 kernels run at the
    H200's power cap, docs/perf-notes.md)."""
    if tiles <= 0 or slots <= 0:
        raise ValueError(f"balanced_grid needs positive tiles and slots, got {tiles}, {slots}")
    return ceil_div(tiles, ceil_div(tiles, slots))


def make_config(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int, out_elem_bytes: int = 2,
                cluster_m: int | None = None, num_stages: int | None = None, split_tail: bool = False,
                chunked_store: bool | None = None, stream_tail: bool = False) -> GemmConfig:
    """A complete config for a tile choice: deepest pipeline that fits (or `num_stages`), cluster and
    pipelining rules."""
    if split_tail and stream_tail:
        raise ValueError("split_tail and stream_tail are two ways to run the last wave: choose one")
    if chunked_store is None:
        chunked_store = chunked_store_for(block_m, block_n, k, out_elem_bytes)
    elif chunked_store and block_m != 256:
        raise ValueError(f"chunked_store is a block_m 256 layout, got block_m {block_m}")
    deepest = max_stages(block_m, block_n, k, out_elem_bytes, chunked_store)
    if num_stages is not None and not 2 <= num_stages <= deepest:
        raise ValueError(f"num_stages must be in [2, {deepest}] for block {block_m}x{block_n}, k={k}; got {num_stages}")
    stages = deepest if num_stages is None else num_stages
    return GemmConfig(
        block_m=block_m,
        block_n=block_n,
        num_stages=stages,
        num_sms=num_sms,
        cluster_m=cluster_m_for(m, block_m, block_n, num_sms) if cluster_m is None else cluster_m,
        pipelined=pipelined_for(block_m, block_n),
        smem_bytes=fp8_gemm_smem_bytes(block_m, block_n, stages, k, out_elem_bytes, chunked_store),
        chunked_store=chunked_store,
        split_tail=split_tail,
        stream_tail=stream_tail,
    )


# Dense GEMMs with M >= 512 and K >= 4096 (session 14, scripts/bench_split.py: the model's pick and 128 x 192 timed
# interleaved, outputs bitwise equal, docs/perf-notes.md v40): 128 x 192 tiles ran 0.7-7% faster on all 37 shapes
# where the rule changes the pick (M = 512-32768; e.g. 32768x4096x7168 1722 -> 1612 us, 16384x7168x16384 3521 -> 3282,
# 768x14336x4096 82.9 -> 77.6, 2048x7168x16384 388.1 -> 370.6) and level on two (8192/16384x4096x7168), where the
# fitted model rated them 1-8% slower; at K = 1536-2048 they ran 3-5% slower, as rated, and at 4096x7168x16384 (ten
# waves of them against seven of 256 x 128) 5% slower, which the share leaves alone. So at those sizes the model's
# schedule estimate of a 128 x 192 tile is scaled by DENSE_WIDE_TILE_SHARE when tiles are ranked; grouped layouts keep
# their own rules (contiguous_tile, masked_tile). Fitted on the H200 (132 SMs); applied on every Hopper GPU, where the
# tuner's measured entries take precedence. (The contiguous rule scales the whole estimate after ranking, by 0.92, as it
# was fitted; this one scales the tile's schedule estimate while ranking, so the HBM floor still applies.)
DENSE_WIDE_TILE = CONTIGUOUS_WIDE_TILE
DENSE_WIDE_TILE_SHARE = 0.93
DENSE_WIDE_TILE_MIN_M = 512
DENSE_WIDE_TILE_MIN_K = 4096


def dense_wide_tile_share(m: int, k: int) -> float:
    """The factor on a dense 128 x 192 tile's estimate (DENSE_WIDE_TILE_SHARE at M >= 512 and K >= 4096, else 1)."""
    return DENSE_WIDE_TILE_SHARE if m >= DENSE_WIDE_TILE_MIN_M and k >= DENSE_WIDE_TILE_MIN_K else 1.0


def ranked_candidates(m: int, n: int, k: int, num_sms: int, out_elem_bytes: int = 2,
                      allow_block_m_256: bool = True, allow_block_m_192: bool = False,
                      wide_tail_k_blocks: float = PREFILL_EXPOSED_K_BLOCKS_WIDE,
                      wide_tile_share: float | None = None) -> list[tuple[float, int, int]]:
    """(ranking seconds, block_m, block_n) for every feasible tile, fastest first: the model's estimate, except that a
    128 x 192 tile's schedule estimate is multiplied by wide_tile_share (None: the dense rule, dense_wide_tile_share;
    grouped layouts pass 1, so theirs is the plain estimate). The tuner ranks its candidates this way too.

    Ties (several tiles at the HBM floor) go to the faster tile schedule, then to fewer tiles. wide_tail_k_blocks:
    the exposed tail of 128 x 192 tiles (grouped layouts pass GROUPED_EXPOSED_K_BLOCKS_WIDE).
    """
    share = dense_wide_tile_share(m, k) if wide_tile_share is None else wide_tile_share
    ranked = []
    for block_m, block_n in candidate_tiles(m, n, allow_block_m_256, allow_block_m_192):
        if max_stages(block_m, block_n, k, out_elem_bytes) < 2:
            continue
        schedule = tile_schedule_seconds(m, n, k, block_m, block_n, num_sms, wide_tail_k_blocks)
        if (block_m, block_n) == DENSE_WIDE_TILE:
            schedule *= share
        seconds = max(schedule, hbm_seconds(m, n, k, out_elem_bytes))
        tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
        ranked.append((seconds, schedule, tiles, block_m, block_n))
    ranked.sort()
    return [(seconds, block_m, block_n) for seconds, _, _, block_m, block_n in ranked]


def choose_fp8_gemm_config(m: int, n: int, k: int, num_sms: int, out_elem_bytes: int = 2,
                           allow_block_m_256: bool = True, allow_block_m_192: bool = False,
                           decode_split: bool = True,
                           wide_tail_k_blocks: float = PREFILL_EXPOSED_K_BLOCKS_WIDE,
                           wide_tile_share: float | None = None) -> GemmConfig:
    """Pick block sizes and stages for D[m, n] = A[m, k] B[n, k]^T on `num_sms` SMs.

    Grouped GEMMs allow block_m 256 only for long contiguous expert segments (contiguous_allows_block_m_256) and
    for masked groups with long K (masked_allows_block_m_256). block_m 192 only on request: in the mid-M sweep
    (benchmarks/h200-mid-m-tune.md) it was never the fastest tile at M >= 512. `decode_split` False: never the
    split-K decode tile (decode_split_block_n), so the plain pick can be timed against it. wide_tile_share: see
    ranked_candidates (None: the dense rule)."""
    if min(m, n, k) <= 0 or num_sms <= 0:
        raise ValueError(f"choose_fp8_gemm_config needs positive m, n, k, num_sms; got {m}, {n}, {k}, {num_sms}")
    ranked = ranked_candidates(m, n, k, num_sms, out_elem_bytes, allow_block_m_256, allow_block_m_192,
                               wide_tail_k_blocks, wide_tile_share)
    if not ranked:
        raise UnsupportedError(f"no FP8 GEMM tile for m={m} n={n} k={k} fits in shared memory")
    _, block_m, block_n = ranked[0]
    split_n = decode_split_block_n(m, n, k, block_m, block_n, num_sms) if decode_split else None
    if split_n is not None:
        return make_config(m, n, k, block_m, split_n, num_sms, out_elem_bytes, split_tail=True)
    # block_m 192 runs as the split-tail kernel: before the tile loader that build measured 6% faster than
    # the plain one on 4096x2112x7168 where nothing splits (106.5-109.2 vs 113.7-116.5 us, same main-loop
    # SASS). Session 6 showed that was a code-layout effect, gone with the tile loader (118 us); plain vs
    # split builds of block_m 192 are not re-measured since, so the choice stands. Real splits paid only with
    # long K ranges (K = 7168 in 8 ranges: +6%; K = 1536 in 3 and K = 512 in 4: -3% and -6%), so not where a
    # split would leave fewer than MIN_K_BLOCKS_PER_SPLIT K blocks per range.
    # The stream tail is not the model's choice: on the H200 it measured slower for block_m 256 (4096x4096x7168
    # 200 vs 188 us) and ~1% faster for 128 x 192 (4096x2112x7168 105.3 vs 106.1), so only the tuner tries it.
    return make_config(m, n, k, block_m, block_n, num_sms, out_elem_bytes,
                       split_tail=model_split_tail(m, n, k, block_m, block_n, num_sms))


# Split-K at decode sizes (H200 sweeps, docs/perf-notes.md session 10): where the model's pick is a narrow
# one-wave tile over a long K, the same work as twice-as-wide tiles cut into K ranges (split_tail_ranges: two
# where the tile count halves) ran 9-16% faster at M = 1-128 for N = 1536, 2048 and 2112 with K = 7168 (block_n
# 16 and 24 picks, and 32 with two M-blocks), and 11% slower where the pick was already 32 wide with one M-block
# (64 x 4096 x 7168) or K was short (16 K blocks: 20-23% slower).
DECODE_SPLIT_MIN_K_BLOCKS = 28


def decode_split_block_n(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int) -> int | None:
    """block_n of the split-K tile that replaces the model's plain decode pick (block_m, block_n), or None."""
    narrow = block_n <= 24 or (ceil_div(m, block_m) >= 2 and block_n <= 32)
    if block_m != 64 or m > 128 or ceil_div(k, 128) < DECODE_SPLIT_MIN_K_BLOCKS or not narrow:
        return None
    split_n = 2 * block_n
    if not spans_at_most_two_scale_blocks(split_n) or not split_tail_applies(m, n, k, block_m, split_n, num_sms):
        return None
    return split_n


def model_split_tail(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int) -> bool:
    """The split-tail choice for a tile without clusters (the cost model, the tuner and tuned entries agree)."""
    return split_tail_for(block_m, ceil_div(m, block_m) * ceil_div(n, block_n), num_sms, ceil_div(k, 128))


def split_tail_for(block_m: int, tiles: int, num_sms: int, k_blocks: int) -> bool:
    """Whether the cost model builds a tile choice as the split-tail kernel (see choose_fp8_gemm_config)."""
    ranges = split_tail_ranges(tiles, num_sms, k_blocks)
    return block_m == 192 and (ranges == 1 or k_blocks >= MIN_K_BLOCKS_PER_SPLIT * ranges)


def split_tail_applies(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int) -> bool:
    """Whether a split-tail build of this tile (without clusters) would split at this M, into K ranges of at
    least MIN_K_BLOCKS_PER_SPLIT blocks (shorter ranges measured slower). At decode sizes, where the tiles fill
    at most half of the SMs, that is split-K: the tuner times such builds next to the plain ones."""
    k_blocks = ceil_div(k, 128)
    ranges = split_tail_ranges(ceil_div(m, block_m) * ceil_div(n, block_n), num_sms, k_blocks)
    return ranges > 1 and k_blocks >= MIN_K_BLOCKS_PER_SPLIT * ranges


def stream_tail_applies(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int) -> bool:
    """Whether a stream-tail build of this tile (without clusters) would split anything at this M: at least
    one full wave and a last wave of more than half of the grid, with a head shorter than K. The tuner
    times such builds next to the plain ones; the cost model does not pick them."""
    tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
    return tiles >= num_sms and stream_tail_split(tiles, num_sms, ceil_div(k, 128)) is not None


STREAM_TAIL_WRITE_BLOCKS = 2  # mirrors StreamTailTileScheduler::kWriteBlocks


def stream_tail_split(tiles: int, grid: int, k_blocks: int) -> int | None:
    """The K block where a stream-tail launch cuts each tail tile into a head and an end (None: nothing is
    split); mirrors StreamTailTileScheduler: a tail of more than half of the grid, each head on its own CTA,
    the ends shared by the CTAs that would idle, at most ceil(tail / idle) each."""
    tail = tiles % grid
    if tail * 2 <= grid:
        return None
    ends_per_cta = ceil_div(tail, grid - tail)
    split = ceil_div(ends_per_cta * (k_blocks + STREAM_TAIL_WRITE_BLOCKS), ends_per_cta + 1)
    return split if split < k_blocks else None


def stream_tail_pieces(tiles: int, grid: int, k_blocks: int) -> int:
    """K ranges per tail tile of a stream-tail launch: 2 (head and end), or 1 where nothing is split."""
    return 1 if stream_tail_split(tiles, grid, k_blocks) is None else 2


MAX_SPLITS = 8  # mirrors SplitTailTileScheduler::kMaxSplits
MIN_K_BLOCKS_PER_SPLIT = 7


def split_tail_ranges(tiles: int, grid: int, k_blocks: int) -> int:
    """K ranges per tail tile of a split-tail launch (1: nothing splits); mirrors SplitTailTileScheduler:
    the tiles of a last wave that fills at most half of the grid are cut into min(grid / tail, 8, K blocks)."""
    tail = tiles % grid
    if tail == 0 or 2 * tail > grid:
        return 1
    return min(grid // tail, MAX_SPLITS, k_blocks)
