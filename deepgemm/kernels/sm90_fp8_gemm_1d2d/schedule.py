"""Tail scheduling of the FP8 1D2D kernel, mirrored on the host: split and stream tails (the balanced grid is
kernels/common/grid.py's, shared with the BF16 kernel).

The split and stream tail functions mirror SplitTailTileScheduler and StreamTailTileScheduler
(scheduler/persistent_tiles.cuh): the host sizes workspaces and counts K ranges with them.
"""

from __future__ import annotations

# The split tail's arithmetic is shared with the BF16 kernel's split-K (re-exported for this family's modules).
from deepgemm.kernels.common.split_scratch import split_tail_ranges as split_tail_ranges
from deepgemm.utils import ceil_div


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


MIN_K_BLOCKS_PER_SPLIT = 7
