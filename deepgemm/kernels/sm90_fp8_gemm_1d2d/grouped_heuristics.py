"""Tile rules of the grouped layouts (contiguous and masked MoE GEMMs): the dense cost model's pick, adjusted where
grouped timings showed it wrong (each rule cites its measurement; docs/performance.md has the tables)."""

from __future__ import annotations

from deepgemm.errors import UnsupportedError
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import (DECODE_MAX_M, DENSE_WIDE_TILE, HBM_BYTES_PER_S,
                                                            MIN_M_FOR_BLOCK_M_256, PREFILL_EXPOSED_K_BLOCKS,
                                                            SHORT_K_BLOCKS, ExposedTail, RankingRules,
                                                            candidate_tiles, choose_fp8_gemm_config, estimate_seconds,
                                                            spans_at_most_two_scale_blocks, tile_seconds)
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages
from deepgemm.utils import ceil_div

# Grouped layouts keep 1.25 exposed K blocks for 128 x 192 tiles (the dense model's 2.0 would move masked groups at
# N = 7168, K = 2048 to 128 x 96, measured 10-28% slower than 128 x 128), and for block_m 256 at short K too (the
# dense model's lower short-K constant comes from removing overlapped stores, which contiguous tiles never had and
# masked block_m 256, K >= 4096 only, never reached).
GROUPED_TAIL = ExposedTail(wide=PREFILL_EXPOSED_K_BLOCKS, short_k_256=PREFILL_EXPOSED_K_BLOCKS)
# The dense model's pick for a grouped layout: its own exposed tail, none of the dense tile shares (each layout has its
# own measured 128 x 192 rule below; with the dense one on too the two corrections would compound) and no decode tie
# rule (not measured on grouped layouts).
GROUPED_RULES = RankingRules(tail=GROUPED_TAIL, tile_shares=False, decode_ties=False)

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


# Masked grouped GEMMs above decode sizes: each group's rows vary around expected_m (MoE routing; benchmarks and
# issue 22 draw expected x U(0.7, 1.3)), and a tile chosen for exactly expected_m rows can sit just below a wave
# boundary the real rows cross. Measured (H200, 1 x ~1024 rows, N = 4096, K = 7168): 256 x 128 tiles ran 51.6 us on
# 1007 rows and 93.3 us on 1229 (one wave became two), 128 x 192 ran 69.1 / 69.7, DeepGEMM HEAD 49.6 / 70.6. So these
# tiles are ranked by the model's expected time over that spread: every group's row count uniform in
# MASKED_ROW_SPREAD x expected_m (capped at max_m), independently, the wave count averaged over the resulting
# distribution of the tile count. Decode-sized groups keep masked_config_m's headroom rule.
MASKED_ROW_SPREAD = (0.7, 1.3)
MASKED_EXACT_GROUPS = 64  # more groups: the mean block count stands for its distribution (bounds the host time)


# Decode-sized masked tiles stay at most MASKED_DECODE_MAX_BLOCK_N wide (block_m 256 keeps its 128 columns).
MASKED_DECODE_MAX_BLOCK_N = 128
# Wider masked tiles: 128 x 192 only. 128 x 160 measured slower than 128 x 128 on 2 x ~512 rows twice (N = 7168,
# K = 2048: 13%; N = 4096, K = 7168: 58.6 against 55.3 us), where the spread ranks it first or close.
MASKED_WIDE_BLOCK_N = 192


# Masked 128 x 192 tiles over 9-16 K blocks (MASKED_WIDE_TILE_MIN_K_BLOCKS < K blocks <= SHORT_K_BLOCKS): on the
# DeepSeek-V3 down projection (N = 7168, K = 2048) the model rates them 2-10% slower than 128 x 128, but timed over 21
# draws (1, 2 and 4 groups, 6-12 M-blocks in all, DeepGEMM HEAD interleaved, 2026-12-03) they ran 1.087 x the model's
# estimate against 128 x 128's 1.240 (a ratio of 0.877), on the geomean over the draws 34.3 / 32.7 / 37.6 us against
# 35.5 / 32.9 / 37.0, and never behind DeepGEMM HEAD (which runs 128 x 192 there), where 128 x 128 was up to 16%
# behind it. So there a 128 x 192 tile's expected schedule time is scaled by this share when tiles are ranked. No
# masked timing below K = 2048 backs it; at K = 7168 the ratio is 0.943 and the three tiles' geomeans are within 2%
# of each other: no share there.
MASKED_WIDE_TILE_SHARE_SHORT_K = 0.88
MASKED_WIDE_TILE_MIN_K_BLOCKS = 8


def masked_width_allowed(block_n: int) -> bool:
    return block_n <= MASKED_DECODE_MAX_BLOCK_N or block_n == MASKED_WIDE_BLOCK_N


def masked_tile(expected_m: int, max_m: int, groups: int, n: int, k: int, num_sms: int,
                out_elem_bytes: int) -> tuple[int, int]:
    """(block_m, block_n) for masked groups of about `expected_m` rows each (at most max_m): at decode sizes the
    model's pick for masked_config_m rows and N x groups columns (the same tile count and weight bytes as one GEMM
    that wide), narrowed to cover N without waste; larger groups the fastest tile by masked_expected_seconds."""
    allow_256 = masked_allows_block_m_256(k) and n >= 128
    rows = masked_config_m(expected_m, max_m)
    if min(expected_m, max_m) <= MASKED_DECODE_MAX_EXPECTED_M:
        base = choose_fp8_gemm_config(rows, n * groups, k, num_sms, out_elem_bytes, allow_block_m_256=allow_256,
                                      rules=GROUPED_RULES)
        if base.block_m == 256:
            return 256, base.block_n
        return base.block_m, max_block_n_for(n, min(base.block_n, MASKED_DECODE_MAX_BLOCK_N))
    counts = {bm: _masked_block_counts(rows, max_m, bm, groups) for bm in (64, 128, 256)}
    ranked = []
    for block_m, block_n in candidate_tiles(rows, n, allow_256, allow_block_m_192=False):
        if masked_width_allowed(block_n) and max_stages(block_m, block_n, k, out_elem_bytes) >= 2:
            share = masked_wide_tile_share(k) if (block_m, block_n) == (128, MASKED_WIDE_BLOCK_N) else 1.0
            seconds = masked_expected_seconds(counts[block_m], rows, groups, n, k, block_m, block_n, num_sms,
                                              out_elem_bytes, share)
            ranked.append((seconds, block_m, block_n))
    if not ranked:
        raise UnsupportedError(f"no masked FP8 GEMM tile for n={n} k={k} fits in shared memory")
    _, block_m, block_n = min(ranked)
    return block_m, block_n


def _masked_block_counts(expected_rows: int, max_m: int, block_m: int, groups: int) -> dict[int, float]:
    """Distribution of the total M-block count of `groups` groups, each holding a uniform row count in
    MASKED_ROW_SPREAD x expected_rows (at most max_m), independently: {blocks: probability}."""
    low = max(1, round(MASKED_ROW_SPREAD[0] * expected_rows))
    high = max(low, min(max_m, round(MASKED_ROW_SPREAD[1] * expected_rows)))
    one: dict[int, float] = {}
    for rows in range(low, high + 1):
        one[ceil_div(rows, block_m)] = one.get(ceil_div(rows, block_m), 0.0) + 1.0 / (high - low + 1)
    if groups > MASKED_EXACT_GROUPS:  # the total's spread is small against its mean: the mean alone
        return {round(groups * sum(blocks * p for blocks, p in one.items())): 1.0}
    total = {0: 1.0}
    for _ in range(groups):
        step: dict[int, float] = {}
        for blocks, p in total.items():
            for more, q in one.items():
                step[blocks + more] = step.get(blocks + more, 0.0) + p * q
        total = step
    return total


def masked_wide_tile_share(k: int) -> float:
    """The factor on a masked 128 x 192 tile's schedule estimate: MASKED_WIDE_TILE_SHARE_SHORT_K over 9-16 K blocks,
    else 1."""
    k_blocks = ceil_div(max(k, 1), 128)
    return MASKED_WIDE_TILE_SHARE_SHORT_K if MASKED_WIDE_TILE_MIN_K_BLOCKS < k_blocks <= SHORT_K_BLOCKS else 1.0


def masked_expected_seconds(block_counts: dict[int, float], expected_rows: int, groups: int, n: int, k: int,
                            block_m: int, block_n: int, num_sms: int, out_elem_bytes: int, share: float = 1.0) -> float:
    """The model's expected time of a masked launch whose total M-block count is distributed as `block_counts`: the
    mean wave count times one tile's time (times `share`, a measured correction), or the HBM floor (every group's
    weights and expected rows)."""
    n_blocks = ceil_div(n, block_n)
    waves = sum(p * ceil_div(blocks * n_blocks, num_sms) for blocks, p in block_counts.items())
    schedule = waves * tile_seconds(expected_rows, k, block_m, block_n, num_sms, GROUPED_TAIL) * share
    rows = groups * expected_rows
    floor = (rows * k + groups * n * k + rows * n * out_elem_bytes) / HBM_BYTES_PER_S
    return max(schedule, floor)


# Contiguous grouped GEMMs (the four DeepSeek-V3 MoE cases, tiles timed interleaved, three runs): 128 x 192 tiles
# ran 6-9% faster than block_m 256 and 5-9% faster than 128 x 128, with bitwise the same output (e.g. 4 x ~8538 rows, N = 4096, K = 7168: 1673.7 against 1790.1 us; 8 x ~4780, N = 7168, K = 2048: 957.3
# against 1054.5), where the fitted model ranks them level with the others. So for this layout the model's estimate
# of a 128 x 192 tile is scaled by CONTIGUOUS_WIDE_TILE_SHARE before it is compared with the model's pick (wave
# quantization still counts: at 8 x 128 rows, N = 4096, two waves of them lose to one of block_m 256).
CONTIGUOUS_WIDE_TILE = DENSE_WIDE_TILE
CONTIGUOUS_WIDE_TILE_SHARE = 0.92


def contiguous_tile(m_total: int, groups: int, n: int, k: int, num_sms: int, out_elem_bytes: int) -> tuple[int, int]:
    """(block_m, block_n) for a contiguous MoE layout of m_total rows in `groups` expert segments: the model's pick
    (block_m 256 only for long segments) or 128 x 192 tiles where their measured advantage makes them faster."""
    m = max(m_total, 1)
    # The dense 128 x 192 rule stays off here (GROUPED_RULES): this layout's own measured rule below decides between
    # the plain pick and 128 x 192 (with it on, the same picks result on a 3600-shape grid).
    base = choose_fp8_gemm_config(m, n, k, num_sms, out_elem_bytes,
                                  allow_block_m_256=contiguous_allows_block_m_256(m_total, groups), rules=GROUPED_RULES)
    block_m, block_n = CONTIGUOUS_WIDE_TILE
    if m > DECODE_MAX_M and n >= block_n and max_stages(block_m, block_n, k, out_elem_bytes) >= 3:
        wide = (estimate_seconds(m, n, k, block_m, block_n, num_sms, out_elem_bytes, GROUPED_TAIL)
                * CONTIGUOUS_WIDE_TILE_SHARE)
        if wide < estimate_seconds(m, n, k, base.block_m, base.block_n, num_sms, out_elem_bytes, GROUPED_TAIL):
            return block_m, block_n
    return base.block_m, base.block_n


def masked_allows_block_m_256(k: int) -> bool:
    """block_m 256 for masked groups only with long K."""
    return k >= MIN_K_FOR_MASKED_BLOCK_M_256

