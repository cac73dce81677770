// The 1D2D GEMM's TMA producer: one thread walks the tile sequence and loads each K block's A, B (128B swizzle)
// and sfa into the stage ring. With kClusterM = 2 the two CTAs of a cluster compute vertically adjacent tiles
// and each loads half of the shared B tile, multicast into both CTAs (half the L2 traffic for B); with
// kClusterN = 2 they compute horizontally adjacent tiles and share A the same way.
#pragma once
#include <deepgemm/ptx/cluster.cuh>
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/tma.cuh>
#include <deepgemm/scheduler/tile_sources.cuh>

namespace deepgemm {

template <typename Cfg>
struct Sm90Fp8Producer1D2D : Cfg {
    using typename Cfg::Ring;
    using typename Cfg::Tiles;
    using Cfg::kBlockK;
    using Cfg::kBlockM;
    using Cfg::kBlockN;
    using Cfg::kClusterM;
    using Cfg::kClusterN;
    using Cfg::kKind;
    using Cfg::kLastBlockN;
    using Cfg::kLoadRowsA;
    using Cfg::kMulticastRowsA;
    using Cfg::kMulticastRowsB;
    using Cfg::kN;
    using Cfg::kNarrowLast;
    using Cfg::kNumKBlocks;
    using Cfg::kNumNBlocks;
    using Cfg::kOffsetA;
    using Cfg::kOffsetB;
    using Cfg::kOffsetSfa;
    using Cfg::kSplitTail;
    using Cfg::kStageABytes;
    using Cfg::kStageBBytes;
    using Cfg::kStageSfaBytes;
    using Cfg::kStageTxBytes;

    // tma_a_last / tma_sfa_last: a dense GEMM's last M-block (dense_last_box_rows); tma_b_last: the
    // last N-block's narrow B box (kNarrowLast).
    DG_DEVICE static void run(const Ring& ring, const TmaDescriptor* tma_a, const TmaDescriptor* tma_b,
                              const TmaDescriptor* tma_sfa, const TmaDescriptor* tma_a_last, const TmaDescriptor* tma_sfa_last,
                              const TmaDescriptor* tma_b_last, const GemmProblem& problem, u32 cta_rank) {
        Tiles tiles(problem, cta_rank);
        GroupedTile tile;
        SplitUnit unit{0, kNumKBlocks, 1, 0, 0};
        u32 stage = 0;
        u32 phase = 0;
        // Dense: the last M-block and its stage bytes (kBlockM rows when M fills it).
        const u32 last_m_block = ceil_div(max(problem.m, 1u), kBlockM) - 1;
        const u32 last_tx_bytes = kStageBBytes + dense_last_box_rows<kBlockM>(problem.m) * (kBlockK + 4);
        while (tiles.next(tile, unit)) {
            if (tile.padding) {
                continue;  // a block of padding rows: nothing to load (the consumers skip it too)
            }
            const u32 k_begin = kSplitTail ? unit.k_begin : 0u;
            const u32 k_end = kSplitTail ? unit.k_end : kNumKBlocks;
            const i32 row_a = static_cast<i32>(tile.row_begin + tile.m_block * kBlockM);
            const i32 row_b = static_cast<i32>(tile.group * kN + tile.n_block * kBlockN);
            // sfa is M-major: its rows are K blocks, its columns M (masked: a 3-D tensor (M, K block, group)).
            const i32 sfa_col = static_cast<i32>(tile.m_block * kBlockM + (kKind == GemmKind::kGroupedMasked ? 0 : tile.row_begin));
            u32 a_boxes = 1;
            u32 tx_bytes = kStageTxBytes;
            const TmaDescriptor* desc_a = tma_a;
            const TmaDescriptor* desc_sfa = tma_sfa;
            if constexpr (kLoadRowsA != kBlockM) {
                a_boxes = ceil_div(min(tile.rows - tile.m_block * kBlockM, kBlockM), kLoadRowsA);
                tx_bytes = kStageTxBytes - kStageABytes + a_boxes * kLoadRowsA * kBlockK;
            } else if constexpr (kKind == GemmKind::kDense && kClusterN == 1) {
                // (With A multicast the last M-block loads whole halves too: TMA zero-fills rows past M.)
                if (tile.m_block == last_m_block) {
                    desc_a = tma_a_last;
                    desc_sfa = tma_sfa_last;
                    tx_bytes = last_tx_bytes;
                }
            }
            const TmaDescriptor* desc_b = tma_b;
            if constexpr (kNarrowLast) {
                if (tile.n_block == kNumNBlocks - 1) {
                    desc_b = tma_b_last;
                    tx_bytes -= (kBlockN - kLastBlockN) * kBlockK;
                }
            }
            for (u32 k_block = k_begin; k_block < k_end; ++k_block) {
                ptx::mbarrier_wait(&ring.empty[stage], phase ^ 1);
                u64* full = &ring.full[stage];
                const i32 k = static_cast<i32>(k_block * kBlockK);
                ptx::mbarrier_arrive_expect_tx(full, tx_bytes);
                if constexpr (kClusterN > 1) {
                    // This CTA's half of the A tile goes to the same offset in both CTAs of the cluster.
                    const u32 half = cta_rank * kMulticastRowsA;
                    ptx::tma_load_2d_multicast(ring.smem + kOffsetA + stage * kStageABytes + half * kBlockK, tma_a, full, k,
                                               row_a + static_cast<i32>(half), (1u << kClusterN) - 1);
                } else if constexpr (kLoadRowsA == kBlockM) {
                    ptx::tma_load_2d(ring.smem + kOffsetA + stage * kStageABytes, desc_a, full, k, row_a);
                } else {
                    for (u32 box = 0; box < a_boxes; ++box) {
                        ptx::tma_load_2d(ring.smem + kOffsetA + stage * kStageABytes + box * kLoadRowsA * kBlockK, tma_a, full,
                                         k, row_a + static_cast<i32>(box * kLoadRowsA));
                    }
                }
                if constexpr (kClusterM == 1) {
                    ptx::tma_load_2d(ring.smem + kOffsetB + stage * kStageBBytes, desc_b, full, k, row_b);
                } else {
                    // This CTA's half of the B tile goes to the same offset in both CTAs of the cluster.
                    const u32 half = cta_rank * kMulticastRowsB;
                    ptx::tma_load_2d_multicast(ring.smem + kOffsetB + stage * kStageBBytes + half * kBlockK, tma_b, full, k,
                                               row_b + static_cast<i32>(half), (1u << kClusterM) - 1);
                }
                if constexpr (kKind == GemmKind::kGroupedMasked) {
                    ptx::tma_load_3d(ring.smem + kOffsetSfa + stage * kStageSfaBytes, desc_sfa, full, sfa_col,
                                     static_cast<i32>(k_block), static_cast<i32>(tile.group));
                } else {
                    ptx::tma_load_2d(ring.smem + kOffsetSfa + stage * kStageSfaBytes, desc_sfa, full, sfa_col,
                                     static_cast<i32>(k_block));
                }
                Ring::advance(stage, phase);
            }
        }
    }
};

}  // namespace deepgemm
