// Tile schedulers for MoE grouped GEMMs (all groups share N and K; B is [G, N, K]).
//
// Contiguous: A holds every group's rows back to back, each group's segment padded to a multiple of
//   the alignment (128 rows), and m_indices[row] names the group of each row (-1 for padding). An
//   M-block never straddles two segments, so its first row's entry is the block's group; a block
//   whose first row is padding is padding throughout (its output rows are stored as zeros).
// Contiguous, psum form: the same layout described by psum[g], the end row (exclusive) of group g's
//   valid rows; group g starts at align_up(psum[g - 1], 128) (psum[-1] = 0). Rows in no group's
//   [start, end) are padding. M-blocks are visited in increasing order by each CTA, so a forward-only
//   cursor finds each block's group with at most G reads of psum per CTA.
// Contiguous with block_m 256: a 256-row block whose two 128-row halves belong to different groups
//   (or one half is padding) is issued as two half tiles, each computing only its first 128-row wave
//   (GroupedTile::rows ends the first at the half boundary; the second starts at row_begin = 128).
// Masked: A is [G, max_m, K]; group g has masked_m[g] valid rows (read from device memory, so a CUDA
//   graph can replay with new counts). Tiles are numbered group by group, M-block fastest.
#pragma once
#include <deepgemm/ptx/types.cuh>
#include <deepgemm/scheduler/persistent_tiles.cuh>

namespace deepgemm {

struct GroupedTile {
    u32 group;      // expert index
    u32 m_block;    // M-block within the group (masked) or within A (contiguous)
    u32 n_block;
    u32 row_begin;  // first row of the group's tensor rows in the flattened [rows, K] view
    u32 rows;       // valid rows of this group in that view, counted from row_begin
    bool padding;   // contiguous only: the whole block is padding (no loads, output rows zeroed)
    u32 valid_end;  // contiguous psum form: rows at or past this one (in the block's group) are padding
};

// Rows of one aligned contiguous segment: a group never starts inside these.
constexpr u32 kContiguousSegmentRows = 128;

// The walk both contiguous forms share: tiles c, c + gridDim.x, ... (N-block fastest for one M-block,
// so consecutive CTAs share the A rows and walk the expert's weights), and with block_m 256 the split of
// a block whose two 128-row halves belong to different groups into two half tiles. The forms differ
// only in how they find the group of a segment.
// kRotateWaves (kernels whose last N-block is narrower, so cheaper): wave w hands CTA c the tile at
// position (c + w * s) % gridDim.x of the wave's tiles [w * gridDim.x, (w + 1) * gridDim.x) instead of c, with s
// the smallest shift that makes (gridDim.x + s) coprime to the N-block count: a wave still covers the same
// tiles, but a CTA's N-block now steps through all of them (between wraps of its position). In the plain walk,
// with 132 CTAs and 22 N-blocks (N = 4096, block_n 192) CTA c gets N-block c % 22 in every wave, so the cheap
// last-block tiles would all go to the same six CTAs, which would finish early and idle; with 38 N-blocks
// (N = 7168) only every other CTA would get any. Host-checked in tests/cpu/tile_schedulers_host.cpp.
// kGroupRows > 1 (m_indices form, blocks of at most one segment): the tiles come in bands of kGroupRows M-blocks,
// M-block fastest inside a band, as the dense raster: a wave then reads the B columns of a few N-blocks for a few
// experts' rows instead of every N-block of the expert's weights, so the weights stay in L2 while the band's rows
// use them. Band b starts its N-blocks at (b * (kNumNBlocks - 2)) % kNumNBlocks, which spreads a narrow last
// N-block's cheap tiles over the CTAs about as evenly as the rotation (a host simulation of the DeepSeek-V3 cases);
// no rotation then.
template <u32 kBlockM, u32 kNumNBlocks, bool kRotateWaves = false, u32 kGroupRows = 1>
struct ContiguousBlockWalk {
    static_assert(kBlockM <= 2 * kContiguousSegmentRows, "a block spans at most two segments");
    static constexpr bool kBanded = kGroupRows > 1 && kBlockM <= kContiguousSegmentRows;
    static constexpr bool kRotate = kRotateWaves && !kBanded;
    static constexpr u32 kBandShift = kNumNBlocks > 2 ? kNumNBlocks - 2 : 0;
    u32 m_total;
    u32 num_groups;
    u32 num_tiles;
    u32 next_tile;  // the first tile of the CTA's next wave plus blockIdx.x (kRotateWaves: before rotation)
    u32 rotation;   // kRotateWaves: (waves walked so far) x s
    u32 shift;      // kRotateWaves: s
    u32 half;       // 1 while the second half of a split block is due

    DG_DEVICE ContiguousBlockWalk(u32 m, u32 groups)
        : m_total(m), num_groups(groups), num_tiles(ceil_div(m, kBlockM) * kNumNBlocks), next_tile(blockIdx.x), rotation(0),
          shift(kRotate ? coprime_shift() : 0), half(0) {}

    // The smallest s >= 0 with gcd((gridDim.x + s) % kNumNBlocks, kNumNBlocks) == 1 (at most kNumNBlocks - 1).
    DG_DEVICE static u32 coprime_shift() {
        for (u32 s = 0;; ++s) {
            u32 a = (gridDim.x + s) % kNumNBlocks;
            u32 b = kNumNBlocks;
            while (a != 0) {
                const u32 r = b % a;
                b = a;
                a = r;
            }
            if (b == 1) {
                return s;
            }
        }
    }

    // The tile this CTA takes in its next wave (>= num_tiles: none). It increases from wave to wave (by at least
    // one tile when rotated), as the psum form's forward-only cursor requires.
    DG_DEVICE u32 tile_index() const {
        if constexpr (kRotate) {
            return next_tile - blockIdx.x + (blockIdx.x + rotation) % gridDim.x;
        } else {
            return next_tile;
        }
    }

    // `first(row, valid_end)` names the group of the segment at the block's first row (num_groups for
    // padding), `second(row, valid_end)` that of the segment 128 rows in.
    template <typename First, typename Second>
    DG_DEVICE bool next(GroupedTile& tile, First first, Second second) {
        const u32 index = tile_index();
        if (index >= num_tiles) {
            return false;  // (rotated: in the last, partial wave this CTA's position may be past the end)
        }
        if constexpr (kBanded) {
            banded_tile<kNumNBlocks, kGroupRows>(index, ceil_div(m_total, kBlockM), tile.m_block, tile.n_block);
            tile.n_block = (tile.n_block + index / (kGroupRows * kNumNBlocks) * kBandShift) % kNumNBlocks;
        } else {
            tile.m_block = index / kNumNBlocks;
            tile.n_block = index % kNumNBlocks;
        }
        const u32 row = tile.m_block * kBlockM;
        u32 group = first(row, tile.valid_end);
        tile.row_begin = 0;
        tile.rows = m_total;
        if constexpr (kBlockM > kContiguousSegmentRows) {
            if (row + kContiguousSegmentRows < m_total) {
                u32 second_end;
                const u32 second_group = second(row + kContiguousSegmentRows, second_end);
                if (half == 1) {
                    group = second_group;
                    tile.valid_end = second_end;
                    tile.row_begin = kContiguousSegmentRows;
                    tile.rows = min(row + kContiguousSegmentRows, m_total - kContiguousSegmentRows);
                    half = 0;
                } else if (second_group != group) {
                    tile.rows = row + kContiguousSegmentRows;  // first wave only
                    half = 1;
                }
            }
        }
        tile.padding = group == num_groups;
        tile.group = tile.padding ? 0 : group;
        if (half == 0) {
            next_tile += gridDim.x;
            if constexpr (kRotate) {
                rotation = (rotation + shift) % gridDim.x;
            }
        }
        return true;
    }
};

template <u32 kBlockM, u32 kNumNBlocks, bool kRotateWaves = false, u32 kGroupRows = 1>
struct ContiguousTileScheduler {
    const i32* m_indices;
    ContiguousBlockWalk<kBlockM, kNumNBlocks, kRotateWaves, kGroupRows> walk;

    DG_DEVICE ContiguousTileScheduler(const i32* indices, u32 m, u32 groups) : m_indices(indices), walk(m, groups) {}

    // The group of the segment starting at `row`; num_groups for padding. An index outside
    // [0, num_groups) is treated as padding: B and sfb are never read out of bounds.
    DG_DEVICE u32 group_of(u32 row, u32& valid_end) const {
        valid_end = 0;  // padding rows come from m_indices itself
        const i32 group = __ldg(m_indices + row);
        return group < 0 || static_cast<u32>(group) >= walk.num_groups ? walk.num_groups : static_cast<u32>(group);
    }

    DG_DEVICE bool next(GroupedTile& tile) {
        const auto lookup = [this](u32 row, u32& valid_end) { return group_of(row, valid_end); };
        return walk.next(tile, lookup, lookup);
    }
};

template <u32 kBlockM, u32 kNumNBlocks, bool kRotateWaves = false>
struct ContiguousPsumTileScheduler {
    const i32* psum;
    ContiguousBlockWalk<kBlockM, kNumNBlocks, kRotateWaves> walk;
    u32 group;       // cursor: first group whose end row is past the current block's first row
    u32 group_end;   // psum[group], clamped to [0, m_total]
    u32 prev_end;    // psum[group - 1] (0 for group 0), clamped

    DG_DEVICE ContiguousPsumTileScheduler(const i32* ends, u32 m, u32 groups)
        : psum(ends), walk(m, groups), group(0), group_end(0), prev_end(0) {
        group_end = load_end(0);
    }

    DG_DEVICE u32 load_end(u32 g) const {
        return g < walk.num_groups ? min(static_cast<u32>(max(__ldg(psum + g), 0)), walk.m_total) : walk.m_total;
    }

    // The group of the segment starting at `row` (num_groups for padding) and its end of valid rows.
    // Rows must not decrease from call to call: the cursor only moves forward.
    DG_DEVICE u32 group_at(u32 row, u32& valid_end) {
        while (group < walk.num_groups && group_end <= row) {
            prev_end = max(prev_end, group_end);  // a decreasing psum (invalid) cannot move starts back
            group_end = load_end(++group);
        }
        const u32 start = align_up(prev_end, kContiguousSegmentRows);
        const bool padding = group >= walk.num_groups || row < start || row >= group_end;
        valid_end = padding ? 0 : group_end;
        return padding ? walk.num_groups : group;
    }

    DG_DEVICE bool next(GroupedTile& tile) {
        // The cursor only ever moves to block starts (the same CTA may visit this block again for its
        // next N-block); the second half is looked up on a copy.
        const auto at_block_start = [this](u32 row, u32& valid_end) { return group_at(row, valid_end); };
        const auto ahead = [this](u32 row, u32& valid_end) {
            ContiguousPsumTileScheduler copy = *this;
            return copy.group_at(row, valid_end);
        };
        return walk.next(tile, at_block_start, ahead);
    }
};

template <u32 kBlockM, u32 kNumNBlocks>
struct MaskedTileScheduler {
    const i32* masked_m;
    u32 num_groups;
    u32 max_m;
    u32 group;        // group holding tiles [group_begin, group_end)
    u32 group_begin;
    u32 group_end;
    u32 group_rows;
    u32 next_tile;

    DG_DEVICE MaskedTileScheduler(const i32* counts, u32 groups, u32 rows_per_group)
        : masked_m(counts), num_groups(groups), max_m(rows_per_group), group(0), group_begin(0), group_end(0),
          group_rows(0), next_tile(blockIdx.x) {
        load_group();
    }

    DG_DEVICE void load_group() {
        const i32 count = group < num_groups ? __ldg(masked_m + group) : 0;
        group_rows = min(static_cast<u32>(max(count, 0)), max_m);
        group_end = group_begin + ceil_div(group_rows, kBlockM) * kNumNBlocks;
    }

    DG_DEVICE bool next(GroupedTile& tile) {
        while (next_tile >= group_end) {
            if (++group >= num_groups) {
                return false;
            }
            group_begin = group_end;
            load_group();
        }
        const u32 in_group = next_tile - group_begin;
        const u32 m_blocks = ceil_div(group_rows, kBlockM);
        tile.group = group;
        tile.m_block = in_group % m_blocks;
        tile.n_block = in_group / m_blocks;
        tile.row_begin = group * max_m;
        tile.rows = group_rows;
        tile.padding = false;
        next_tile += gridDim.x;
        return true;
    }
};

}  // namespace deepgemm
