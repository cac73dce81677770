// The 1D2D GEMM's K loop for one tile of one math warpgroup: every 128-wide K block is multiplied by wgmma
// from shared memory into a fresh FP32 partial, the stage is released, and the partial is promoted into the
// warpgroup's results with sfa (per row, from the stage) x sfb (per 128 columns, from the tile slot).
// Each math warpgroup owns 64 rows of the tile (block_m 256: two 64-row waves, rows 128v + 64w for wave v of
// warpgroup w, sharing the stage's B tile); with kPipelinedPromotion the next K block's MMAs are issued into
// a second accumulator first.
#pragma once
#include <deepgemm/mainloop/fp8_promotion.cuh>
#include <deepgemm/ptx/cluster.cuh>
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/ptx/wgmma.cuh>
#include <deepgemm/ptx/wgmma_fp8.cuh>

namespace deepgemm {

// What one tile's K loop needs besides the ring position, the scales and the results.
struct TileLoop {
    u32 k_begin;
    u32 k_end;
    u32 rows;           // the tile's rows within its group (waves at or past them issue nothing)
    u32 row_in_tensor;  // this warpgroup's first row within the group's rows
    u32 first_row;      // this warpgroup's first row within the tile
    u32 math_wg;
    u32 row_in_wg;
    u32 lane;
};

template <typename Cfg>
struct Sm90Fp8KLoop1D2D : Cfg {
    using typename Cfg::Ring;
    using Cfg::kBlockK;
    using Cfg::kBlockN;
    using Cfg::kClusterSize;
    using Cfg::kMayStraddle;
    using Cfg::kNumKBlocks;
    using Cfg::kNumWaves;
    using Cfg::kOffsetA;
    using Cfg::kOffsetB;
    using Cfg::kOffsetSfa;
    using Cfg::kPipelinedPromotion;
    using Cfg::kScaleBlock;
    using Cfg::kStageABytes;
    using Cfg::kStageBBytes;
    using Cfg::kStageSfaBytes;
    using Cfg::kStaticStraddle;
    using Cfg::kStraddleStep;
    using Cfg::wave_row;
    using Promotion = Fp8Promotion<kBlockN, kNumKBlocks>;
    // Dense tiles run every wave's MMAs, also past M (those rows are zero-filled or stale in shared memory, and
    // never stored): the wave loop then has no branch on per-thread values, which keeps the stage's descriptors
    // in uniform registers. Grouped waves past a group's rows are skipped (they are another group's rows).
    static constexpr bool kSkipEmptyWaves = Cfg::kKind != GemmKind::kDense;

    // Tell the producers of every CTA sharing this stage that this warp is done with it.
    DG_DEVICE static void release_stage(const Ring& ring, u32 stage, u32 lane) {
        __syncwarp();
        if (lane == 0) {
            if constexpr (kClusterSize == 1) {
                ptx::mbarrier_arrive(&ring.empty[stage]);
            } else {
#pragma unroll
                for (u32 rank = 0; rank < kClusterSize; ++rank) {
                    ptx::mbarrier_arrive_cluster(&ring.empty[stage], rank);
                }
            }
        }
    }

    // Read this thread's sfa from a (full) stage and issue the four k32 MMAs of one 128-wide K block of one
    // wave into `partial` (kTileN columns). The descriptors' start fields are the tiles' base fields offset by
    // stage and row (no address masking per block).
    template <u32 kTileN>
    DG_DEVICE static void issue_block(const Ring& ring, u32 stage, u32 first_row, u32 row_in_wg,
                                      float (&partial)[kTileN / 2], ScaleA& scale_a) {
        static_assert(kStageABytes % 16 == 0 && kStageBBytes % 16 == 0 && kBlockK % 16 == 0);
        const float* sfa_stage = reinterpret_cast<const float*>(ring.smem + kOffsetSfa + stage * kStageSfaBytes);
        scale_a.lo = sfa_stage[first_row + row_in_wg];
        scale_a.hi = sfa_stage[first_row + row_in_wg + 8];
        const u32 start_a =
            ptx::smem_desc_start(ring.smem + kOffsetA) + stage * (kStageABytes >> 4) + first_row * (kBlockK >> 4);
        const u32 start_b = ptx::smem_desc_start(ring.smem + kOffsetB) + stage * (kStageBBytes >> 4);
        ptx::mma_k128_block<ptx::WgmmaFp8<kTileN>>(start_a, start_b, partial);
        ptx::fence_accumulators(partial);
    }

    // One accumulator: per wave issue, wait, promote; the stage is released after the last wave's MMAs.
    // Two math warpgroups overlap each other's promotion with their MMAs. Everything the promotion needs
    // besides the accumulator (sfb, sfa, their products) is read before the wait, so the wait -> FFMA -> next
    // issue chain is as short as it can be.
    template <u32 kStraddleCol, u32 kTileN>
    DG_DEVICE static void k_loop_single(const Ring& ring, u32& stage, u32& phase, const TileLoop& t, const Promotion& promotion,
                                        float (&results)[kNumWaves][kBlockN / 2]) {
        float partial[kTileN / 2];
        // Unrolled by 4: ptxas then schedules the next block's full-barrier wait, scale reads and descriptors
        // inside this block's promotion FFMAs, which a loop back-edge keeps it from doing (measured 1-5% faster
        // at M >= 1024 than no unroll; by 8, wide-tile builds spill or run slower).
#pragma unroll 4
        for (u32 k_block = t.k_begin; k_block < t.k_end; ++k_block) {
            const ScaleB scale_b = promotion.scale_b(k_block);
            ptx::mbarrier_wait(&ring.full[stage], phase);
#pragma unroll
            for (u32 w = 0; w < kNumWaves; ++w) {
                // With kSkipEmptyWaves, waves past the tile's rows (a masked group's last block_m 256 tile,
                // contiguous half tiles) issue nothing.
                if (kSkipEmptyWaves && w > 0 && t.row_in_tensor + (wave_row(w, t.math_wg) - t.first_row) >= t.rows) {
                    break;
                }
                ScaleA scale_a;
                issue_block<kTileN>(ring, stage, wave_row(w, t.math_wg), t.row_in_wg, partial, scale_a);
                const BlockScales scales = Promotion::combine(scale_a, scale_b);
                ptx::wgmma_wait_group<0>();
                ptx::fence_accumulators(partial);
                const bool last_wave =
                    w + 1 == kNumWaves ||
                    (kSkipEmptyWaves && t.row_in_tensor + (wave_row(w + 1, t.math_wg) - t.first_row) >= t.rows);
                if (last_wave) {
                    release_stage(ring, stage, t.lane);  // every MMA reading the stage is done
                }
                promotion.template apply<kStraddleCol, kTileN>(results[w], partial, scales);
            }
            Ring::advance(stage, phase);
        }
    }

    // The promotion of the block before the one just issued. Its FFMAs do not depend on those MMAs, and ptxas
    // would schedule them between the first and the second of the four wgmma (the other three then wait for the
    // whole promotion, and the tensor cores get a quarter of the block to overlap it with). A branch on
    // `after_issue` (non-zero, opaque to both compilers: ptx::opaque_nonzero, hidden again before each use so NVVM
    // does not hoist the branch out of the loop) ends the basic block after the fourth. On an H100 that ran dense
    // 128 x 128 1-2% faster, but masked 128 x 128 2-4% and 64 x 64 3-4% slower until the producer was elected too
    // (Cfg::kElectedProducer): a consumer that leaves each stage sooner makes thread 0's per-load lane loop the limit.
    template <u32 kStraddleCol, u32 kTileN>
    DG_DEVICE static void promote_after_issue(const Promotion& promotion, float (&result)[kBlockN / 2],
                                              const float (&partial)[kTileN / 2], const BlockScales& scales,
                                              u32& after_issue) {
        ptx::opaque(after_issue);
        if (after_issue != 0) {
            promotion.template apply<kStraddleCol, kTileN>(result, partial, scales);
        }
    }

    // Two accumulators: block k+1's MMAs run while block k is promoted, so the tensor cores stay busy even
    // when every warpgroup promotes at the same time (one wave per warpgroup).
    template <u32 kStraddleCol, u32 kTileN>
    DG_DEVICE static void k_loop_pipelined(const Ring& ring, u32& stage, u32& phase, const TileLoop& t, const Promotion& promotion,
                                           float (&result)[kBlockN / 2]) {
        float partial0[kTileN / 2];
        float partial1[kTileN / 2];
        BlockScales scales0;
        BlockScales scales1;
        u32 issue_stage = stage;
        u32 issue_phase = phase;
        u32 issue_k_block = t.k_begin;
        const auto issue = [&](float (&partial)[kTileN / 2], BlockScales& scales) {
            const ScaleB scale_b = promotion.scale_b(issue_k_block++);
            ptx::mbarrier_wait(&ring.full[issue_stage], issue_phase);
            ScaleA scale_a;
            issue_block<kTileN>(ring, issue_stage, t.first_row, t.row_in_wg, partial, scale_a);
            scales = Promotion::combine(scale_a, scale_b);
            Ring::advance(issue_stage, issue_phase);
        };
        const auto retire = [&](float (&partial)[kTileN / 2]) {
            ptx::wgmma_wait_group<0>();
            ptx::fence_accumulators(partial);
            release_stage(ring, stage, t.lane);
            Ring::advance(stage, phase);
        };
        // Only wait_group<0> is used, and each promotion reads the accumulator retired by the
        // previous wait while the other one's MMAs run: ptxas can then prove no in-flight
        // accumulator is read and keeps the MMAs asynchronous (a wait_group<1> loop gets serialized).
        issue(partial0, scales0);
        u32 k_block = t.k_begin;
        u32 after_issue = ptx::opaque_nonzero();
        for (; k_block + 2 < t.k_end; k_block += 2) {
            retire(partial0);
            issue(partial1, scales1);
            promote_after_issue<kStraddleCol, kTileN>(promotion, result, partial0, scales0, after_issue);
            retire(partial1);
            issue(partial0, scales0);
            promote_after_issue<kStraddleCol, kTileN>(promotion, result, partial1, scales1, after_issue);
        }
        retire(partial0);
        if ((t.k_end - t.k_begin) % 2 == 0) {
            issue(partial1, scales1);
            promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);  // ptxas's order (as timed)
            retire(partial1);
            promotion.template apply<kStraddleCol, kTileN>(result, partial1, scales1);
        } else {
            promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);
        }
    }

    // One tile's K loop: MMAs into FP32 partials, promoted into `results` with their scales every K block.
    // kStraddleCol: the tile's scale-block switch column when known at compile time, 0 for a run-time select;
    // kTileN: the tile's columns (block_n, or kLastBlockN for a narrow last N-block).
    template <u32 kStraddleCol, u32 kTileN = kBlockN>
    DG_DEVICE static void k_loop(const Ring& ring, u32& stage, u32& phase, const TileLoop& t, const Promotion& promotion,
                                 float (&results)[kNumWaves][kBlockN / 2]) {
        if constexpr (!kPipelinedPromotion) {
            k_loop_single<kStraddleCol, kTileN>(ring, stage, phase, t, promotion, results);
        } else {
            k_loop_pipelined<kStraddleCol, kTileN>(ring, stage, phase, t, promotion, results[0]);
        }
    }

    // k_loop compiled once per possible switch column of straddling tiles when there are at most four
    // (kStaticStraddle), so each column's scale is chosen at compile time; otherwise with a run-time select.
    template <u32 kCol = kStraddleStep>
    DG_DEVICE static void k_loop_for(u32 straddle_col, const Ring& ring, u32& stage, u32& phase, const TileLoop& t,
                                     const Promotion& promotion, float (&results)[kNumWaves][kBlockN / 2]) {
        if constexpr (!kMayStraddle) {
            k_loop<kScaleBlock>(ring, stage, phase, t, promotion, results);
        } else if constexpr (!kStaticStraddle) {
            k_loop<0>(ring, stage, phase, t, promotion, results);
        } else if constexpr (kCol < kScaleBlock) {
            if (straddle_col == kCol) {
                k_loop<kCol>(ring, stage, phase, t, promotion, results);
            } else {
                k_loop_for<kCol + kStraddleStep>(straddle_col, ring, stage, phase, t, promotion, results);
            }
        } else {
            k_loop<kScaleBlock>(ring, stage, phase, t, promotion, results);
        }
    }
};

}  // namespace deepgemm
