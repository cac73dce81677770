// Tile scheduler of the k-grouped GEMMs (expert weight gradients): every group g has its own [M, N] output
// and owns the K range [k_offsets[g], k_offsets[g + 1]) of both operands. Tiles are numbered group by group,
// inside a group in the dense GEMM's banded raster of kGroupRows M-blocks (1: N-block fastest inside an
// M-block); each CTA takes every gridDim.x-th.
#pragma once
#include <deepgemm/ptx/types.cuh>
#include <deepgemm/scheduler/persistent_tiles.cuh>

namespace deepgemm {

struct KGroupedTile {
    u32 group;
    u32 m_block;
    u32 n_block;
    u32 k_begin;   // first K index of the group
    u32 k_blocks;  // kBlockK-wide K blocks of the group
};

template <u32 kNumNBlocks, u32 kBlockK, u32 kGroupRows = 1>
struct KGroupedTileScheduler {
    const i32* k_offsets;  // [num_groups + 1], multiples of kBlockK (host-checked), non-decreasing
    u32 num_groups;
    u32 num_m_blocks;
    u32 tiles_per_group;
    u32 next_tile;

    DG_DEVICE KGroupedTileScheduler(const i32* offsets, u32 groups, u32 m_blocks)
        : k_offsets(offsets),
          num_groups(groups),
          num_m_blocks(m_blocks),
          tiles_per_group(m_blocks * kNumNBlocks),
          next_tile(blockIdx.x) {}

    DG_DEVICE bool next(KGroupedTile& tile) {
        if (next_tile >= num_groups * tiles_per_group) {
            return false;
        }
        tile.group = next_tile / tiles_per_group;
        const u32 in_group = next_tile % tiles_per_group;
        if constexpr (kGroupRows == 1) {
            tile.m_block = in_group / kNumNBlocks;
            tile.n_block = in_group % kNumNBlocks;
        } else {
            banded_tile<kNumNBlocks, kGroupRows>(in_group, num_m_blocks, tile.m_block, tile.n_block);
        }
        const i32 begin = __ldg(k_offsets + tile.group);
        const i32 end = __ldg(k_offsets + tile.group + 1);
        // Invalid offsets (negative, decreasing) give an empty K range; TMA bounds-checks the rest.
        tile.k_begin = static_cast<u32>(max(begin, 0));
        tile.k_blocks = end > begin && begin >= 0 ? static_cast<u32>(end - begin) / kBlockK : 0;
        next_tile += gridDim.x;
        return true;
    }
};

}  // namespace deepgemm
