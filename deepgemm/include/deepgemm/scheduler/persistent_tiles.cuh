// Persistent tile scheduler over an (M-blocks x N-blocks) grid of output tiles.
// The unit of work is a cluster tile: kClusterM vertically adjacent tiles sharing one N-block (the CTAs of
// a cluster share B through TMA multicast). Cluster c walks cluster tiles c, c + num_clusters, ...;
// the CTA of rank r takes M-block kClusterM * row + r. Producer and consumers each own a copy and see
// the same sequence.
#pragma once
#include <deepgemm/ptx/types.cuh>

namespace deepgemm {

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupRows, u32 kClusterM>
struct PersistentTileScheduler {
    u32 num_rows;  // rows of cluster tiles: ceil(M-blocks / kClusterM)
    u32 num_tiles;
    u32 next_tile;
    u32 cta_rank;
    u32 num_clusters;

    DG_DEVICE PersistentTileScheduler(u32 m, u32 rank)
        : num_rows(ceil_div(ceil_div(m, kBlockM), kClusterM)),
          num_tiles(ceil_div(ceil_div(m, kBlockM), kClusterM) * kNumNBlocks),
          next_tile(blockIdx.x / kClusterM),
          cta_rank(rank),
          num_clusters(gridDim.x / kClusterM) {}

    // Rasterization for L2 reuse: cluster tiles come in bands of kGroupRows rows; inside a band the row
    // index moves fastest, so clusters running at the same time share both A rows and B columns.
    DG_DEVICE bool next(u32& m_block, u32& n_block) {
        if (next_tile >= num_tiles) {
            return false;
        }
        const u32 band_tiles = kGroupRows * kNumNBlocks;
        const u32 band = next_tile / band_tiles;
        const u32 in_band = next_tile % band_tiles;
        const u32 band_first_row = band * kGroupRows;
        const u32 band_height = min(kGroupRows, num_rows - band_first_row);
        m_block = (band_first_row + in_band % band_height) * kClusterM + cta_rank;
        n_block = in_band / band_height;
        next_tile += num_clusters;
        return true;
    }
};

}  // namespace deepgemm
