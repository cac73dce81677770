"""Closed-form tile choice for the dense FP8 GEMM: a small cost model a human can audit.

For each candidate (block_m, block_n) the model estimates
    time = max(waves * tile_time, hbm_bytes / hbm_bandwidth)
where waves = ceil(tiles / num_sms) and tile_time = max(MMA time, time to stream the tile's A and B rows from L2
into one SM), plus above decode sizes a fixed cost per tile. Small block_n pays a per-instruction overhead in the
MMA term. Decode sizes (M <= 128) and larger M have their own constants, each fitted to H200 timings of that regime
(docs/performance.md lists the measurements). The fastest estimate wins; ties go to fewer tiles (less redundant
operand traffic). The pipeline depth is the most stages that fit in shared memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepgemm.errors import UnsupportedError
from deepgemm.kernels.common.grid import balanced_grid_applies
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig, math_warpgroups
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import model_split_tail, split_tail_applies
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import chunked_store_for, fp8_gemm_smem_bytes, max_stages
from deepgemm.utils import align_up, ceil_div

# Machine model (H100/H200 SXM), used only to rank candidates.
FP8_DENSE_FLOPS = 1.98e15
HBM_BYTES_PER_S = 4.0e12
L2_TO_SM_BYTES_PER_S = 1.0e11  # one SM's share of L2 read bandwidth
MMA_OVERHEAD_COLUMNS = 24  # wgmma issue overhead, in equivalent N columns

# Decode regime (M <= DECODE_MAX_M): share of time the tensor cores work. Unpipelined promotion overlaps only across
# math warpgroups (one warpgroup cannot overlap at all); block_m 256 streams 25% fewer operand bytes per FLOP than
# 128 x 128; block_m 192's share is fitted to its measured time on 4096x2112x7168.
UNPIPELINED_MMA_SHARE = {64: 0.4, 128: 0.8, 192: 0.77, 256: 0.95}
PIPELINED_MMA_SHARE = {64: 0.7, 128: 0.9}
# Tiles whose block_n does not divide 128 straddle two sfb blocks: per-column scale selects in the promotion
# (measured ~30% slower on the H200 tile sweep). The decode constants keep the penalty for every straddling width;
# above decode sizes it applies only to straddles resolved at run time (static_straddle).
STRADDLE_SHARE = 0.7
MAX_PIPELINED_BLOCK_N = 128  # 3 x block_n/2 accumulator registers must fit next to ~40 others

# Above decode sizes the same terms are fitted to measurements (7 tiles x 42 shapes, M = 160-3072 on the six
# DeepSeek-V3 (N, K) pairs, H200; rms error 6%): t = waves x (K blocks x per-K-block MMA time + per-tile cost).
DECODE_MAX_M = 128
PREFILL_MMA_OVERHEAD_COLUMNS = 54
PREFILL_PIPELINED_MMA_SHARE = {64: 0.70, 128: 0.99}
PREFILL_UNPIPELINED_MMA_SHARE = {64: 0.40, 128: 0.955, 192: 0.87, 256: 1.065}  # 64 unpipelined: scaled, not measured
PREFILL_TILE_SECONDS = 0.68e-6  # per tile: tile start and epilogue ...
# ... and, with one or two unpipelined math warpgroups, the last K block's MMAs and promotion, which nothing overlaps,
# in K blocks of MMA time (block_m 192's three warpgroups overlap it). 128 x 192 tiles expose more (a per-tile-type
# fit: 2.0 K blocks; with it the short-K picks move to 128 x 128, measured 3-5% faster).
PREFILL_EXPOSED_K_BLOCKS = 1.25
PREFILL_EXPOSED_K_BLOCKS_WIDE = 2.0  # block_n >= PREFILL_WIDE_BLOCK_N with block_m 128
PREFILL_WIDE_BLOCK_N = 192
# block_m 256 over at most 16 K blocks exposes less: the fit above was measured while those tiles stored their waves
# inside the next tile's K loop (since removed); with the plain epilogue 4096x32768x512 ran 124.2 us on 256 x 128
# against 133.6 on 128 x 128 (the fitted constant rated it 2% slower). Per-tile residuals at K = 512 / 1536 / 2048
# put the exposure at 0.2-0.7 K blocks.
PREFILL_EXPOSED_K_BLOCKS_256_SHORT_K = 0.5
SHORT_K_BLOCKS = 16


@dataclass(frozen=True)
class ExposedTail:
    """The exposed tail (K blocks of MMA time) of the tiles whose tail a layout measured apart from the base fit:
    128 x 192 (`wide`) and block_m 256 over at most SHORT_K_BLOCKS K blocks (`short_k_256`)."""

    wide: float
    short_k_256: float


DENSE_TAIL = ExposedTail(wide=PREFILL_EXPOSED_K_BLOCKS_WIDE, short_k_256=PREFILL_EXPOSED_K_BLOCKS_256_SHORT_K)


def max_block_n(block_m: int) -> int:
    """Widest tile whose two FP32 accumulators (block_n registers per thread) fit the register budget."""
    return 192


def clusters_allowed(m: int, block_m: int, block_n: int, num_sms: int) -> bool:
    """Whether a tile may run as 2-CTA clusters: halves of B for multicast (block_n % 16 == 0), pairs of SMs,
    two or more M-blocks, and not block_m 192 (its three math warpgroups leave no registers for it). The model
    never picks clusters (B multicast measured slower on 17 of 18 H200 shapes); the tuner times them and a config
    may ask for them (cluster_m=2)."""
    return block_n % 16 == 0 and num_sms % 2 == 0 and ceil_div(m, block_m) >= 2 and block_m != 192


def pipelined_for(block_m: int, block_n: int) -> bool:
    """Two partial accumulators fit for block_n <= 128; block_m 256 already holds two waves of results and
    block_m 192's three math warpgroups get 160 registers each."""
    return block_m not in (192, 256) and block_n <= MAX_PIPELINED_BLOCK_N


def estimate_seconds(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int, out_elem_bytes: int,
                     tail: ExposedTail = DENSE_TAIL) -> float:
    """Estimated run time: the slower of the tile schedule and the HBM floor."""
    return max(tile_schedule_seconds(m, n, k, block_m, block_n, num_sms, tail),
               hbm_seconds(m, n, k, out_elem_bytes))


def hbm_seconds(m: int, n: int, k: int, out_elem_bytes: int) -> float:
    return (m * k + n * k + m * n * out_elem_bytes) / HBM_BYTES_PER_S


def tile_schedule_seconds(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int,
                          tail: ExposedTail = DENSE_TAIL) -> float:
    """waves x per-tile time (tile_seconds)."""
    waves = ceil_div(ceil_div(m, block_m) * ceil_div(n, block_n), num_sms)
    return waves * tile_seconds(m, k, block_m, block_n, num_sms, tail)


def tile_seconds(m: int, k: int, block_m: int, block_n: int, num_sms: int,
                 tail: ExposedTail = DENSE_TAIL) -> float:
    """One tile's time in a wave of an M-row problem: the slower of MMA and streaming operands from L2, plus (above
    decode sizes) a fixed cost per tile. `tail`: the exposed tails measured apart (grouped layouts pass their own)."""
    k_padded = align_up(max(k, 1), 128)
    mma_per_k_block = 2 * block_m * block_n * 128 / (FP8_DENSE_FLOPS / num_sms * mma_efficiency(m, block_m, block_n))
    mma = mma_per_k_block * k_padded / 128
    stream = (block_m + block_n) * k_padded / L2_TO_SM_BYTES_PER_S
    tile_fixed = 0.0
    if m > DECODE_MAX_M:
        exposed_tail = not pipelined_for(block_m, block_n) and math_warpgroups(block_m) < 3
        exposed = tail.wide if block_m == 128 and block_n >= PREFILL_WIDE_BLOCK_N else PREFILL_EXPOSED_K_BLOCKS
        if block_m == 256 and k_padded // 128 <= SHORT_K_BLOCKS:
            exposed = tail.short_k_256
        tile_fixed = PREFILL_TILE_SECONDS + (exposed * mma_per_k_block if exposed_tail else 0.0)
    return max(mma, stream) + tile_fixed


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


MIN_M_FOR_BLOCK_M_256 = 512  # block_m 256 and 192 need M >= 512 (measured no faster below)


def candidate_tiles(m: int, n: int, allow_block_m_256: bool = True, allow_block_m_192: bool = True) -> list[tuple[int, int]]:
    """Feasible (block_m, block_n): block_m 256 only where allowed (dense; grouped layouts under their own rules)
    with M >= 512 and block_n 128 (256 x 64 measured slower than 128 x 128 on 4096x2112x7168 although it fills whole
    waves); block_m 192 (dense only: grouped layouts align blocks to 128 rows) with M >= 512 and block_n 128."""
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


def make_config(m: int, n: int, k: int, block_m: int, block_n: int, num_sms: int, out_elem_bytes: int = 2,
                cluster_m: int = 1, num_stages: int | None = None, split_tail: bool = False,
                chunked_store: bool | None = None, stream_tail: bool = False, balanced_grid: bool | None = None,
                narrow_last_n: bool = True, cluster_n: int = 1) -> GemmConfig:
    """A complete config for a tile choice: deepest pipeline that fits (or `num_stages`) and the pipelining rule.
    balanced_grid None: the dense default (balanced_grid_applies); grouped plans pass False."""
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
        cluster_m=cluster_m,
        pipelined=pipelined_for(block_m, block_n),
        smem_bytes=fp8_gemm_smem_bytes(block_m, block_n, stages, k, out_elem_bytes, chunked_store),
        chunked_store=chunked_store,
        split_tail=split_tail,
        stream_tail=stream_tail,
        balanced_grid=balanced_grid_applies(k) if balanced_grid is None else balanced_grid,
        narrow_last_n=narrow_last_n,
        cluster_n=cluster_n,
    )


# Dense GEMMs with M >= 512 and K >= 4096: 128 x 192 tiles, timed interleaved against the model's pick, ran 0.7-7%
# faster on all 37 H200 shapes where a share on their estimate changed the pick and level on two (the fitted model
# rated them 1-8% slower); at 4096x7168x16384 (ten waves against seven of 256 x 128) they ran slower, as rated. So a
# 128 x 192 tile's schedule estimate is scaled by DENSE_WIDE_TILE_SHARE when tiles are ranked (the HBM floor still
# applies). Re-timed after the K-loop unroll (2026-12-04, dev/model_ab.py, 32 and 36 shapes,
# benchmarks/h200-wide-tile-rules.md): at 2048 <= K < 4096 the share moved seven picks to 128 x 192, six of them
# 0.4-4.7% faster and one +0.3%, so it applies from K = 2048. Measured against 256 x 128 the share was 0.96-0.98 at
# M <= 8192 (0.94-0.96 at M = 32768; 0.93-0.95 against 128 x 128), so where the share puts 128 x 192 first at those M,
# 256 x 128 is rated against it with DENSE_TALL_TILE_SHARE = 0.93 / 0.965 (only against it: rated so against
# 128 x 160 at M <= 2048, 256 x 128 ran 0.1-5% slower).
# Fitted on the H200 (132 SMs); the tuner's measured entries take precedence.
DENSE_WIDE_TILE = (128, 192)
DENSE_WIDE_TILE_SHARE = 0.93
DENSE_WIDE_TILE_MIN_M = 512
DENSE_WIDE_TILE_MIN_K = 2048
DENSE_TALL_TILE = (256, 128)
DENSE_TALL_TILE_SHARE = 0.964
DENSE_TALL_TILE_MAX_M = 8192


def dense_wide_tile_share(m: int, k: int) -> float:
    """The factor on a dense 128 x 192 tile's estimate (DENSE_WIDE_TILE_SHARE at M >= 512 and K >= 2048, else 1)."""
    return DENSE_WIDE_TILE_SHARE if m >= DENSE_WIDE_TILE_MIN_M and k >= DENSE_WIDE_TILE_MIN_K else 1.0


def dense_tall_tile_share(m: int, k: int) -> float:
    """The factor on a dense 256 x 128 tile's estimate when it is ranked against a first-placed 128 x 192
    (DENSE_TALL_TILE_SHARE where the 128 x 192 share applies and M <= DENSE_TALL_TILE_MAX_M, else 1)."""
    applies = dense_wide_tile_share(m, k) != 1.0 and m <= DENSE_TALL_TILE_MAX_M
    return DENSE_TALL_TILE_SHARE if applies else 1.0


# Decode sizes with two 64-row M-blocks (64 < M <= 128): where a 128-row tile and a 64-row tile tie in the model (the
# HBM floor, the same schedule and tile count, e.g. 128 x 64 and 64 x 128), the 128-row tile reads each B block once
# instead of once per M-block and runs two math warpgroups. Timed interleaved on the H200 (2026-12-04,
# dev/dense_tile_ab.py, benchmarks/h200-decode-tiles.md): 128 x 64 against the 64 x 128 it replaces, M = 128,
# 24576x1536 -6.0%, 7168x2048 -2.4%, 6144x4096 -2.4%, 7168x16384 -1.4%; at K = 28672 (8192x28672) +2.1%, so only up to
# DECODE_TWO_WARPGROUP_MAX_K.
DECODE_TWO_WARPGROUP_MAX_K = 16384


def prefers_two_warpgroups(m: int, k: int) -> bool:
    """Whether a dense GEMM's ties between tiles break toward block_m 128 (see DECODE_TWO_WARPGROUP_MAX_K), else toward
    block_m 64. Grouped layouts keep block_m 64 (not measured there)."""
    return 64 < m <= DECODE_MAX_M and k <= DECODE_TWO_WARPGROUP_MAX_K


@dataclass(frozen=True)
class RankingRules:
    """The measured corrections ranked_candidates applies to the fitted estimate, per GEMM kind: `tail` (see
    tile_seconds), `tile_shares` (dense_wide_tile_share for 128 x 192, and dense_tall_tile_share for 256 x 128 where
    128 x 192 comes first) and `decode_ties` (prefers_two_warpgroups). The defaults are the dense GEMM's; grouped
    layouts pass their own (grouped_heuristics.GROUPED_RULES)."""

    tail: ExposedTail = DENSE_TAIL
    tile_shares: bool = True
    decode_ties: bool = True


DENSE_RULES = RankingRules()


def ranked_candidates(m: int, n: int, k: int, num_sms: int, out_elem_bytes: int = 2,
                      allow_block_m_256: bool = True, allow_block_m_192: bool = False,
                      rules: RankingRules = DENSE_RULES) -> list[tuple[float, int, int]]:
    """(ranking seconds, block_m, block_n) for every feasible tile, fastest first: the model's estimate with `rules`'
    corrections (the dense GEMM's by default). The tuner ranks its candidates this way too.

    Ties (several tiles at the HBM floor) go to the faster tile schedule, then to fewer tiles, then to the smaller
    block_m (the larger one where prefers_two_warpgroups and rules.decode_ties).
    """
    tail = rules.tail
    share = dense_wide_tile_share(m, k) if rules.tile_shares else 1.0
    wider_first = rules.decode_ties and prefers_two_warpgroups(m, k)
    hbm = hbm_seconds(m, n, k, out_elem_bytes)
    ranked = []
    for block_m, block_n in candidate_tiles(m, n, allow_block_m_256, allow_block_m_192):
        if max_stages(block_m, block_n, k, out_elem_bytes) < 2:
            continue
        schedule = tile_schedule_seconds(m, n, k, block_m, block_n, num_sms, tail)
        if (block_m, block_n) == DENSE_WIDE_TILE:
            schedule *= share
        seconds = max(schedule, hbm)
        tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
        tie = -block_m if wider_first else block_m
        ranked.append((seconds, schedule, tiles, tie, block_n, block_m))
    ranked.sort()
    tall_share = dense_tall_tile_share(m, k) if rules.tile_shares else 1.0
    if tall_share != 1.0 and ranked and (ranked[0][5], ranked[0][4]) == DENSE_WIDE_TILE:
        # 256 x 128 against the 128 x 192 the share put first: rated with its own share (see DENSE_TALL_TILE_SHARE).
        tall = next((entry for entry in ranked if (entry[5], entry[4]) == DENSE_TALL_TILE), None)
        if tall is not None:
            schedule = tall[1] * tall_share
            if max(schedule, hbm) < ranked[0][0]:
                ranked.remove(tall)
                ranked.insert(0, (max(schedule, hbm), schedule, *tall[2:]))
    return [(seconds, block_m, block_n) for seconds, _, _, _, block_n, block_m in ranked]


def choose_fp8_gemm_config(m: int, n: int, k: int, num_sms: int, out_elem_bytes: int = 2,
                           allow_block_m_256: bool = True, allow_block_m_192: bool = False,
                           decode_split: bool = True, rules: RankingRules = DENSE_RULES) -> GemmConfig:
    """Pick block sizes and stages for D[m, n] = A[m, k] B[n, k]^T on `num_sms` SMs.

    Grouped GEMMs allow block_m 256 only under their own rules (grouped_heuristics). block_m 192 only on request: in
    the mid-M sweep it was never the fastest tile at M >= 512. `decode_split` False: never the
    split-K decode tile (decode_split_block_n), so the plain pick can be timed against it. `rules`: see
    ranked_candidates."""
    if min(m, n, k) <= 0 or num_sms <= 0:
        raise ValueError(f"choose_fp8_gemm_config needs positive m, n, k, num_sms; got {m}, {n}, {k}, {num_sms}")
    ranked = ranked_candidates(m, n, k, num_sms, out_elem_bytes, allow_block_m_256, allow_block_m_192, rules)
    if not ranked:
        raise UnsupportedError(f"no FP8 GEMM tile for m={m} n={n} k={k} fits in shared memory")
    _, block_m, block_n = ranked[0]
    split_n = decode_split_block_n(m, n, k, block_m, block_n, num_sms) if decode_split else None
    if split_n is not None:
        return make_config(m, n, k, block_m, split_n, num_sms, out_elem_bytes, split_tail=True)
    # block_m 192 runs as the split-tail kernel (model_split_tail): real splits paid only with long K ranges. The
    # stream tail is the tuner's choice only (measured slower for block_m 256, ~1% faster for 128 x 192).
    return make_config(m, n, k, block_m, block_n, num_sms, out_elem_bytes,
                       split_tail=model_split_tail(m, n, k, block_m, block_n, num_sms))


# Split-K at decode sizes (H200 sweeps): where the model's pick is a narrow
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

