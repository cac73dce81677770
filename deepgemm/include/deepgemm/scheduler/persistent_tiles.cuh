// Persistent tile schedulers over an (M-blocks x N-blocks) grid of output tiles.
// The unit of work is a cluster tile: kClusterM vertically adjacent tiles sharing one N-block (the CTAs of
// a cluster share B through TMA multicast), or kClusterN horizontally adjacent tiles sharing one M-block
// (they share A). Cluster c walks cluster tiles c, c + num_clusters, ...; the CTA of rank r takes M-block
// kClusterM * row + r (N-block kClusterN * column + r). Producer and consumers each own a copy and see
// the same sequence.
#pragma once
#include <deepgemm/ptx/types.cuh>

namespace deepgemm {

// Rasterization for L2 reuse: tiles of a num_rows x kNumNBlocks grid come in bands of kGroupRows rows; inside a
// band the row index moves fastest, so CTAs running at the same time share both A rows and B columns.
template <u32 kNumNBlocks, u32 kGroupRows>
DG_DEVICE void banded_tile(u32 tile, u32 num_rows, u32& row, u32& n_block) {
    const u32 band_tiles = kGroupRows * kNumNBlocks;
    const u32 band = tile / band_tiles;
    const u32 in_band = tile % band_tiles;
    const u32 band_first_row = band * kGroupRows;
    const u32 band_height = min(kGroupRows, num_rows - band_first_row);
    row = band_first_row + in_band % band_height;
    n_block = in_band / band_height;
}

// Rows per TMA box of A for the last M-block of a dense GEMM of m rows: that block's rows rounded up to 8 (M itself
// when M is below one block: decode), kBlockM when M fills it. A box that overhangs the tensor by most of its rows
// is slow (measured on the H200: FP8 1 x 2112 x 7168 23.0 -> 14.7 us with the small box), so the kernels load the
// last block through a second descriptor with this box; the host encodes the same (common/layout.py). Rows past
// the box are stale shared memory; their outputs lie past M and are never stored.
template <u32 kBlockM>
DG_DEVICE u32 dense_last_box_rows(u32 m) {
    const u32 rows = m - (ceil_div(max(m, 1u), kBlockM) - 1) * kBlockM;
    return align_up(max(rows, 1u), 8u);
}

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupRows, u32 kClusterM, u32 kClusterN = 1>
struct PersistentTileScheduler {
    static_assert(kClusterM == 1 || kClusterN == 1, "clusters pair tiles along M or along N, not both");
    static_assert(kNumNBlocks % kClusterN == 0, "N-block pairs need an even number of N-blocks");
    static constexpr u32 kClusterSize = kClusterM * kClusterN;
    static constexpr u32 kClusterColumns = kNumNBlocks / kClusterN;
    u32 num_rows;  // rows of cluster tiles: ceil(M-blocks / kClusterM)
    u32 num_tiles;
    u32 next_tile;
    u32 cta_rank;
    u32 num_clusters;

    DG_DEVICE PersistentTileScheduler(u32 m, u32 rank)
        : num_rows(ceil_div(ceil_div(m, kBlockM), kClusterM)),
          num_tiles(ceil_div(ceil_div(m, kBlockM), kClusterM) * kClusterColumns),
          next_tile(blockIdx.x / kClusterSize),
          cta_rank(rank),
          num_clusters(gridDim.x / kClusterSize) {}

    // Cluster tiles in the banded raster (clusters running at the same time share A rows and B columns).
    DG_DEVICE void tile_at(u32 tile, u32& m_block, u32& n_block) const {
        u32 row;
        u32 column;
        banded_tile<kClusterColumns, kGroupRows>(tile, num_rows, row, column);
        if constexpr (kClusterN == 1) {
            m_block = row * kClusterM + cta_rank;
            n_block = column;
        } else {
            m_block = row;
            n_block = column * kClusterN + cta_rank;
        }
    }

    DG_DEVICE bool next(u32& m_block, u32& n_block) {
        if (next_tile >= num_tiles) {
            return false;
        }
        tile_at(next_tile, m_block, n_block);
        next_tile += num_clusters;
        return true;
    }
};

// The same raster with the last, partial wave split along K ("split tail"): when the tiles left after
// the full waves fill at most half of the grid, each of them is cut into `splits` K ranges (at most
// kMaxSplits, at least one K block each) so every CTA gets a piece of the last wave. Units 0 ..
// full_tiles - 1 are whole tiles; unit full_tiles + s * tail_tile + c is K range c of tail tile
// `tail_tile`. A CTA takes units blockIdx.x, + gridDim.x, ...: at most one unit of the tail each.
// With fewer tiles than CTAs (decode-sized M) every tile is a tail tile: plain split-K, which cuts the
// activation rows each SM reads by the number of ranges.
struct SplitUnit {
    u32 k_begin;    // first K block of the range
    u32 k_end;      // one past the last
    u32 splits;     // 1 for a whole tile
    u32 tail_tile;  // split units: index among the tail tiles
    u32 slot;       // split units: the partial's workspace slot (split tail: tail_tile * splits + range; stream: tail_tile)
};

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupRows, u32 kNumKBlocks>
struct SplitTailTileScheduler {
    static constexpr u32 kMaxSplits = 8;
    PersistentTileScheduler<kBlockM, kNumNBlocks, kGroupRows, 1> raster;
    u32 full_tiles;
    u32 splits;
    u32 num_units;
    u32 next_unit;

    DG_DEVICE SplitTailTileScheduler(u32 m) : raster(m, 0), full_tiles(0), splits(1), num_units(0), next_unit(blockIdx.x) {
        const u32 tiles = raster.num_tiles;
        const u32 grid = gridDim.x;
        const u32 tail = tiles % grid;
        if (tail != 0 && tail * 2 <= grid) {
            splits = min(min(grid / tail, kMaxSplits), kNumKBlocks);
        }
        full_tiles = splits > 1 ? tiles - tail : tiles;
        num_units = full_tiles + (tiles - full_tiles) * splits;
    }

    DG_DEVICE bool next(u32& m_block, u32& n_block, SplitUnit& unit) {
        if (next_unit >= num_units) {
            return false;
        }
        u32 tile = next_unit;
        unit.splits = 1;
        unit.k_begin = 0;
        unit.k_end = kNumKBlocks;
        unit.tail_tile = 0;
        unit.slot = 0;
        if (next_unit >= full_tiles) {
            const u32 in_tail = next_unit - full_tiles;
            const u32 range = in_tail % splits;
            unit.splits = splits;
            unit.tail_tile = in_tail / splits;
            unit.slot = in_tail;
            unit.k_begin = range * kNumKBlocks / splits;
            unit.k_end = (range + 1) * kNumKBlocks / splits;
            tile = full_tiles + unit.tail_tile;
        }
        raster.tile_at(tile, m_block, n_block);
        next_unit += gridDim.x;
        return true;
    }
};

// The same raster with a last partial wave of more than half of the grid ("stream tail"): its T tiles are
// cut at K block `split` into a head [0, split) and an end [split, K blocks). The heads start together at
// the last wave from K block 0, as whole tiles would (so they read A and B at the same K positions and
// share them in L2, as whole tiles do), head of tail tile t on CTA E + t; the E = G - T CTAs that would idle
// take the ends, tile t to CTA t % E, at most p = ceil(T / E) each. The head is the tile's reducer: it waits
// for the end's FP32 partial (workspace slot t), adds it and stores. Ends never wait, and a head waits only
// for a CTA of lower index: with CTAs dispatched in index order a head's wait always ends, even when fewer
// CTAs than the grid fit on the GPU at once (another kernel holding SMs). `split` balances a head against
// p ends plus their partials' writes (kWriteBlocks K blocks each): split = ceil(p (K blocks + kWriteBlocks) / (p + 1)).
template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupRows, u32 kNumKBlocks>
struct StreamTailTileScheduler {
    static constexpr u32 kWriteBlocks = 2;
    PersistentTileScheduler<kBlockM, kNumNBlocks, kGroupRows, 1> raster;
    u32 full_tiles;
    u32 tail;      // tail tiles (0: nothing is split)
    u32 split;     // first K block of a tail tile's end
    u32 next_tile;
    u32 idle;      // E = G - T: CTAs below it run ends, the others one head each
    u32 next_end;  // the next tail tile whose end (CTA < idle) or head (CTA >= idle) this CTA runs; >= tail: none

    DG_DEVICE StreamTailTileScheduler(u32 m)
        : raster(m, 0), full_tiles(0), tail(0), split(kNumKBlocks), next_tile(blockIdx.x), idle(0), next_end(0) {
        const u32 tiles = raster.num_tiles;
        const u32 grid = gridDim.x;
        const u32 tail_tiles = tiles % grid;
        full_tiles = tiles;
        if (tail_tiles * 2 > grid) {
            const u32 ends_per_cta = ceil_div(tail_tiles, grid - tail_tiles);
            const u32 k = ceil_div(ends_per_cta * (kNumKBlocks + kWriteBlocks), ends_per_cta + 1);
            if (k < kNumKBlocks) {
                full_tiles = tiles - tail_tiles;
                tail = tail_tiles;
                split = k;
                idle = grid - tail_tiles;
                next_end = blockIdx.x < idle ? blockIdx.x : blockIdx.x - idle;
            }
        }
    }

    DG_DEVICE bool next(u32& m_block, u32& n_block, SplitUnit& unit) {
        unit.splits = 1;
        unit.k_begin = 0;
        unit.k_end = kNumKBlocks;
        unit.tail_tile = 0;
        unit.slot = 0;
        if (next_tile < full_tiles) {
            raster.tile_at(next_tile, m_block, n_block);
            next_tile += gridDim.x;
            return true;
        }
        if (next_end >= tail) {
            return false;
        }
        unit.splits = 2;
        unit.tail_tile = next_end;
        unit.slot = next_end;
        if (blockIdx.x >= idle) {
            unit.k_end = split;  // the head; this CTA's last unit
            next_end = tail;
        } else {
            unit.k_begin = split;
            next_end += idle;
        }
        raster.tile_at(full_tiles + unit.tail_tile, m_block, n_block);
        return true;
    }
};

}  // namespace deepgemm
