"""Tile rules of the grouped layouts (contiguous and masked MoE GEMMs): the dense cost model's pick, adjusted where
grouped timings showed it wrong (each rule cites its measurement; docs/performance.md has the tables)."""

from __future__ import annotations

from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import (DECODE_MAX_M, DENSE_WIDE_TILE, MIN_M_FOR_BLOCK_M_256,
                                                            PREFILL_EXPOSED_K_BLOCKS, choose_fp8_gemm_config,
                                                            estimate_seconds, spans_at_most_two_scale_blocks)
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages

# Grouped layouts keep 1.25 exposed K blocks for 128 x 192 tiles (the dense model's 2.0 would move masked groups at
# N = 7168, K = 2048 to 128 x 96, measured 10-28% slower than 128 x 128).
GROUPED_EXPOSED_K_BLOCKS_WIDE = PREFILL_EXPOSED_K_BLOCKS

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
    rows at N = K = 7168: 128 x 160 becomes 128 x 128, which the model estimates 7% slower than 256 x 128)."""
    base = choose_fp8_gemm_config(max(expected_rows, 1), n * groups, k, num_sms, out_elem_bytes,
                                  allow_block_m_256=masked_allows_block_m_256(k) and n >= 128,
                                  wide_tail_k_blocks=GROUPED_EXPOSED_K_BLOCKS_WIDE, wide_tile_share=1.0)
    if base.block_m == 256:
        return 256, base.block_n
    return base.block_m, max_block_n_for(n, min(base.block_n, MASKED_MAX_BLOCK_N))


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

