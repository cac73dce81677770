// FP8 (e4m3) GEMM with DeepSeek-V3 fine-grained scaling on sm_90a:
//   D[M,N] = (A * sfa) @ (B * sfb)^T,  A [M,K] e4m3 with 1x128 scales sfa, B [N,K] e4m3 with 128x128 scales sfb.
// Every 128-wide K block is multiplied by wgmma into a fresh FP32 accumulator, then promoted into the
// output accumulator with its scales on the CUDA cores (never one long FP8 accumulation).
//
// One CTA = 1 producer warpgroup + kBlockM/64 math warpgroups, persistent over tiles. The pieces:
//   impls/sm90_fp8_gemm_1d2d_config.cuh       compile-time constants, register split, shared-memory map;
//   scheduler/tile_sources.cuh                the tile sequence of each GemmKind and tail mode;
//   mainloop/sm90_fp8_1d2d_producer.cuh       the TMA thread (A, B, sfa into the stage ring; B or A multicast in clusters);
//   mainloop/sm90_fp8_1d2d_tile_loader.cuh    the tile loader warp and the tile slots it fills a tile ahead;
//   mainloop/sm90_fp8_1d2d_k_loop.cuh         a math warpgroup's K loop (wgmma, stage release, promotion);
//   mainloop/fp8_promotion.cuh                the promotion with sfa x sfb;
//   epilogue/sm90_fp8_1d2d_wave_stores.cuh    registers -> shared memory -> TMA stores, one per wave;
//   epilogue/split_reduction.cuh              the split and stream tails' reductions of FP32 partials;
//   epilogue/contiguous_padding.cuh           the contiguous layouts' padding rows.
// block_m 256 serves dense GEMMs, masked groups (a group's last tile skips the waves past its rows) and the
// contiguous layout (a block whose two 128-row halves hold different experts runs as two half tiles, see
// grouped_tiles.cuh). M is a run-time value; N, K and every tile constant are compile-time.
#pragma once
#include <deepgemm/epilogue/contiguous_padding.cuh>
#include <deepgemm/epilogue/sm90_fp8_1d2d_wave_stores.cuh>
#include <deepgemm/epilogue/split_reduction.cuh>
#include <deepgemm/impls/sm90_fp8_gemm_1d2d_config.cuh>
#include <deepgemm/mainloop/sm90_fp8_1d2d_k_loop.cuh>
#include <deepgemm/mainloop/sm90_fp8_1d2d_producer.cuh>
#include <deepgemm/mainloop/sm90_fp8_1d2d_tile_loader.cuh>
#include <deepgemm/ptx/cluster.cuh>
#include <deepgemm/ptx/tma.cuh>

namespace deepgemm {

template <u32 kN, u32 kK, u32 kBlockM, u32 kBlockN, u32 kNumStages, u32 kGroupM, u32 kClusterM, bool kPipelinedPromotion,
          bool kOutputFp32, GemmKind kKind = GemmKind::kDense, TailMode kTail = TailMode::kWhole, bool kChunkedStore = false,
          bool kNarrowLastN = true, u32 kClusterN = 1>
struct Sm90Fp8Gemm1D2D : Sm90Fp8Gemm1D2DConfig<kN, kK, kBlockM, kBlockN, kNumStages, kGroupM, kClusterM, kPipelinedPromotion,
                                               kOutputFp32, kKind, kTail, kChunkedStore, kNarrowLastN, kClusterN> {
    using Cfg = Sm90Fp8Gemm1D2DConfig<kN, kK, kBlockM, kBlockN, kNumStages, kGroupM, kClusterM, kPipelinedPromotion, kOutputFp32,
                                      kKind, kTail, kChunkedStore, kNarrowLastN, kClusterN>;
    using Cfg::kClusterSize;
    using typename Cfg::Ring;
    using typename Cfg::Store;
    using typename Cfg::Tiles;
    using Cfg::kDBytesPerWarpgroup;
    using Cfg::kElectedProducer;
    using Cfg::kLastBlockN;
    using Cfg::kMathRegisters;
    using Cfg::kNarrowLast;
    using Cfg::kNumKBlocks;
    using Cfg::kNumMathThreads;
    using Cfg::kNumNBlocks;
    using Cfg::kNumWaves;
    using Cfg::kOffsetBarriers;
    using Cfg::kOffsetD;
    using Cfg::kOffsetFlags;
    using Cfg::kProducerRegisters;
    using Cfg::kScaleBlock;
    using Cfg::kSfbSlotFloats;
    using Cfg::kSplitTail;
    using Cfg::kTileLoader;
    using Cfg::wave_row;

    using Producer = Sm90Fp8Producer1D2D<Cfg>;
    using Loader = Sm90Fp8TileLoader1D2D<Cfg>;
    using Mainloop = Sm90Fp8KLoop1D2D<Cfg>;
    using Promotion = typename Mainloop::Promotion;
    using Slots = TileSlots<Cfg>;
    using Stores = WaveStores<Cfg>;
    using Padding = PaddingRows<Cfg>;
    using Reduction = SplitReduction<Cfg>;

    // What a math thread keeps for the whole kernel.
    struct MathThread {
        u32 math_wg;
        u32 thread_in_wg;
        u32 lane;
        u32 row_in_wg;  // and row_in_wg + 8
        u32 barrier_id;
        u32 first_row;  // this warpgroup's first row within the tile
    };

    // Contiguous layout: a block of padding rows stores zeros and reads nothing.
    DG_DEVICE static void run_padding_tile(Stores& stores, const MathThread& me, const GroupedTile& tile, const Slots& slots,
                                           u32 use) {
        Store store{stores.smem + kOffsetD + me.math_wg * kDBytesPerWarpgroup, stores.count};
        Padding::store_block(store, stores.tma_d, tile, me.math_wg, me.thread_in_wg, me.barrier_id);
        stores.count = store.count;
        if constexpr (kTileLoader) {
            slots.release(use);
        }
    }

    // All 64 rows of this warpgroup are past M: keep the ring moving, compute nothing.
    DG_DEVICE static void skip_tile(const Ring& ring, u32& stage, u32& phase, const MathThread& me, u32 k_begin, u32 k_end,
                                    const Slots& slots, u32 use) {
        for (u32 k_block = k_begin; k_block < k_end; ++k_block) {
            ptx::mbarrier_wait(&ring.full[stage], phase);
            Mainloop::release_stage(ring, stage, me.lane);
            Ring::advance(stage, phase);
        }
        if constexpr (kTileLoader) {
            slots.release(use);
        }
    }

    // The K loop of a tile: the narrow last N-block's, or the one for the tile's scale-block switch column.
    DG_DEVICE static void k_loop_tile(const Ring& ring, u32& stage, u32& phase, float (&results)[kNumWaves][kBlockN / 2],
                                      const GroupedTile& tile, const TileLoop& loop, const Promotion& promotion,
                                      u32 straddle_col) {
        if constexpr (kNarrowLast) {
            if (tile.n_block == kNumNBlocks - 1) {
                // The last block's switch column is a compile-time constant (0 as kStraddleCol means "run time":
                // it is never 0 here, the switch column is in [gcd(block_n, 128), 128]).
                constexpr u32 kLastStraddleCol = kScaleBlock - (kNumNBlocks - 1) * kBlockN % kScaleBlock;
                Mainloop::template k_loop<kLastStraddleCol, kLastBlockN>(ring, stage, phase, loop, promotion, results);
            } else {
                Mainloop::k_loop_for(straddle_col, ring, stage, phase, loop, promotion, results);
            }
        } else {
            Mainloop::k_loop_for(straddle_col, ring, stage, phase, loop, promotion, results);
        }
    }

    // A computed tile's epilogue: padding rows zeroed (`row_groups`: their m_indices entries, loaded at the tile's
    // start), split units reduced, the slot released, the waves stored.
    DG_DEVICE static void finish_tile(const Ring& ring, Stores& stores, float (&results)[kNumWaves][kBlockN / 2],
                                      const GemmProblem& problem, const MathThread& me, const GroupedTile& tile,
                                      const SplitUnit& unit, const Slots& slots, u32 use,
                                      const typename Padding::RowGroups& row_groups) {
        const u32 rows = tile.rows;
        const u32 tile_row = tile.m_block * kBlockM + me.first_row;  // = row_in_tensor, read again
        const u32 row0 = tile.row_begin + tile_row;  // in the flattened output
        const u32 col0 = tile.n_block * kBlockN;
        if constexpr (kKind == GemmKind::kGroupedContiguous || kKind == GemmKind::kGroupedContiguousPsum) {
            Padding::zero_rows(results, problem, tile, row0, me.math_wg, me.first_row, me.row_in_wg, row_groups);
        }
        if constexpr (kSplitTail) {
            u32* flags = reinterpret_cast<u32*>(ring.smem + kOffsetFlags);
            if (!Reduction::reduce(problem, unit, flags, me.math_wg, me.thread_in_wg, me.barrier_id, results)) {
                if constexpr (kTileLoader) {
                    slots.release(use);
                }
                return;  // another K range of this tile stores it
            }
        }
        if constexpr (kTileLoader) {
            slots.release(use);
        }
        stores.put_tile(results, col0, row0, tile_row, rows, me.math_wg, me.first_row);
    }

    // One tile of one math warpgroup: K loop and epilogue. `tile`, `unit` and `sfb_tile` live in the tile
    // slot (tile loader; released as soon as the epilogue has read what it needs) or in this thread's
    // registers and the warpgroup's staged sfb (own schedule). `results` is the warpgroup's accumulator,
    // zeroed here.
    DG_DEVICE static void run_tile(const Ring& ring, u32& stage, u32& phase, Stores& stores, float (&results)[kNumWaves][kBlockN / 2],
                                   const GemmProblem& problem, const MathThread& me, const GroupedTile& tile,
                                   const SplitUnit& unit, const float* sfb_tile, const Slots& slots, u32 use) {
        if (tile.padding) {
            run_padding_tile(stores, me, tile, slots, use);
            return;
        }
        // Only what the K loop needs is read here; the epilogue reads `tile` again (with the loader the
        // K loop's barriers make the compiler reload it from the slot, so none of it stays in registers).
        const u32 k_begin = kSplitTail ? unit.k_begin : 0u;
        const u32 k_end = kSplitTail ? unit.k_end : kNumKBlocks;
        const u32 row_in_tensor = tile.m_block * kBlockM + me.first_row;  // within the group's rows
        if (row_in_tensor >= tile.rows) {
            skip_tile(ring, stage, phase, me, k_begin, k_end, slots, use);
            return;
        }

        const u32 straddle_col = kScaleBlock - tile.n_block * kBlockN % kScaleBlock;
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            Stores::zero(results[w]);
        }
        const typename Padding::RowGroups row_groups =
            Padding::load_row_groups(problem, tile.row_begin + row_in_tensor, me.math_wg, me.first_row, me.row_in_wg);
        const Promotion promotion{sfb_tile, straddle_col};
        const TileLoop loop{k_begin, k_end, tile.rows, row_in_tensor, me.first_row, me.math_wg, me.row_in_wg, me.lane};
        k_loop_tile(ring, stage, phase, results, tile, loop, promotion, straddle_col);
        finish_tile(ring, stores, results, problem, me, tile, unit, slots, use, row_groups);
    }

    DG_DEVICE static void consumer(const Ring& ring, const Slots& slots, const OutputDescriptors* tma_d, const float* sfb,
                                   const GemmProblem& problem, u32 cta_rank) {
        MathThread me;
        me.math_wg = __shfl_sync(0xFFFFFFFFu, threadIdx.x / 128 - 1, 0);  // warp-uniform: kept in uniform registers
        me.thread_in_wg = threadIdx.x % 128;
        me.lane = me.thread_in_wg % 32;
        me.row_in_wg = (me.thread_in_wg / 32) * 16 + me.lane / 4;
        me.barrier_id = 1 + me.math_wg;
        me.first_row = wave_row(0, me.math_wg);
        Stores stores{ring.smem, tma_d, 0};
        float results[kNumWaves][kBlockN / 2];
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            Stores::zero(results[w]);
        }
        u32 stage = 0;
        u32 phase = 0;
        if constexpr (kTileLoader) {
            for (u32 use = 0;; ++use) {
                ptx::mbarrier_wait(slots.full(use), Slots::parity(use));
                const TileSlot<Cfg>& slot = *slots.slot(use);
                if (slot.done != 0) {
                    break;
                }
                run_tile(ring, stage, phase, stores, results, problem, me, slot.tile, slot.unit, slot.sfb, slots, use);
            }
        } else {
            // One math warpgroup: it schedules its own tiles and stages each one's sfb rows in slot 0.
            float* sfb_tile = slots.slot(0)->sfb;
            Tiles tiles(problem, cta_rank);
            GroupedTile tile;
            SplitUnit unit{0, kNumKBlocks, 1, 0, 0};
            while (tiles.next(tile, unit)) {
                if (!tile.padding && tile.m_block * kBlockM + me.first_row < tile.rows) {
                    // (The previous tile's promotions are done: its epilogue synchronized the warpgroup.)
                    for (u32 i = me.thread_in_wg; i < kSfbSlotFloats; i += 128) {
                        sfb_tile[i] = __ldg(Loader::tile_sfb_source(sfb, tile, i));
                    }
                    ptx::named_barrier_sync(me.barrier_id, 128);
                }
                run_tile(ring, stage, phase, stores, results, problem, me, tile, unit, sfb_tile, slots, 0);
            }
        }
        Store::drain(me.thread_in_wg);
    }

    // tma_a_last / tma_sfa_last: a dense GEMM's last M-block (see dense_last_box_rows); other kinds never read them.
    // tma_b_last: B in boxes of kLastBoxRowsB rows, for the last N-block (read only with kNarrowLast).
    DG_DEVICE static void run(const TmaDescriptor* tma_a, const TmaDescriptor* tma_b, const TmaDescriptor* tma_sfa,
                              const TmaDescriptor* tma_a_last, const TmaDescriptor* tma_sfa_last, const TmaDescriptor* tma_b_last,
                              const OutputDescriptors* tma_d, const float* sfb, const GemmProblem& problem) {
        extern __shared__ __align__(1024) u8 smem[];
        const Ring ring = Ring::at(smem, kOffsetBarriers);
        const Slots tile_slots{smem};

        if (threadIdx.x == 0) {
            ptx::tma_prefetch_descriptor(tma_a);
            ptx::tma_prefetch_descriptor(tma_b);
            ptx::tma_prefetch_descriptor(tma_sfa);
            if constexpr (kKind == GemmKind::kDense) {
                ptx::tma_prefetch_descriptor(tma_a_last);
                ptx::tma_prefetch_descriptor(tma_sfa_last);
            }
            if constexpr (kNarrowLast) {
                ptx::tma_prefetch_descriptor(tma_b_last);
            }
            ptx::tma_prefetch_descriptor(&tma_d->width128);
            tile_slots.init();
            ring.init(kClusterSize * kNumMathThreads / 32);  // (its fence also covers the tile-slot barriers)
        }
        const u32 cta_rank = kClusterSize == 1 ? 0 : ptx::cluster_cta_rank();
        if constexpr (kClusterSize == 1) {
            __syncthreads();
        } else {
            ptx::cluster_sync();  // both CTAs' barriers exist before any multicast or remote arrive
        }
        ptx::grid_dependency_wait();  // the previous kernel's writes are visible from here on

        if (threadIdx.x < 128) {
            ptx::setmaxnreg_dec<kProducerRegisters>();
            if (is_producer_thread<kElectedProducer>()) {
                Producer::run(ring, tma_a, tma_b, tma_sfa, tma_a_last, tma_sfa_last, tma_b_last, problem, cta_rank);
                ptx::launch_dependents();  // this CTA's TMA loads are issued: a dependent may start its prologue
            } else if (kTileLoader && threadIdx.x / 32 == 1) {
                Loader::run(tile_slots, sfb, problem, cta_rank, threadIdx.x % 32);
            }
        } else {
            ptx::setmaxnreg_inc<kMathRegisters>();
            consumer(ring, tile_slots, tma_d, sfb, problem, cta_rank);
        }
        if constexpr (kClusterSize > 1) {
            // The peer may still arrive on this CTA's barriers: neither CTA leaves before both are done.
            __syncwarp();
            ptx::cluster_sync();
        }
    }
};

}  // namespace deepgemm
