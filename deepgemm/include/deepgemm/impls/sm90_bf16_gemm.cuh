// BF16 GEMM on sm_90a in every layout:  D[M,N] = C + A @ B^T with FP32 accumulation over the whole K, and its
// grouped kinds (GemmKind): M-grouped contiguous / psum / masked (NT: A [rows, K], B [G, N, K], one expert per
// tile, as the FP8 kernel's schedulers define them) and k-grouped (TN: A [K_total, M], B [K_total, N] token-major,
// D [G, M, N] FP32 = C[g] + A_g^T B_g over group g's K range).
// A is [M,K] (K-major) or given as [K,M] (MN-major), B [N,K] or given as [K,N]; wgmma reads either major order
// from shared memory (its transpose bits), so no layout is copied. D is BF16 or FP32; the optional addend C
// (BF16 or FP32, [M,N], may be D itself) is read in the epilogue, or, when C is an FP32 D itself
// (kAddendInPlace), the tile is added into D by TMA reduce-add stores and C is never loaded.
//
// One CTA = 1 TMA producer warpgroup (setmaxnreg down) + kBlockM / 64 math warpgroups of 64 rows each,
// persistent over its kind's tile sequence (dense: PersistentTileScheduler's banded raster). Stages of 64 K: a
// K-major tile is 128-byte rows (one swizzle row each), an MN-major tile is 64-element atoms along MN of 64 K
// rows, both loaded by TMA with the 128B swizzle. Each K block is one wgmma commit group; the stage of the
// previous one is released as soon as it retires (one group in flight). Epilogue: registers -> shared memory
// -> TMA store (store_fragment.cuh), which clips the M and N tails (k-grouped: 3-D descriptors clip each group's
// rows at M); TMA zero-fills the K tail of both operands (k-grouped K ranges are whole 64-wide blocks). A dense
// K-major A's partial last M-block is loaded in a box of its rows (dense_last_box_rows, a second descriptor). With
// kStoreN < kBlockN a warpgroup stores its tile in kStoreN-column chunks through two small staging buffers in
// turn (a chunk's shared-memory writes overlap the previous chunk's store), so wide FP32 tiles keep their stages.
// kSplitK (dense, decode sizes): a last wave of at most half the grid is cut into K ranges
// (SplitTailTileScheduler), whose FP32 partials meet in a workspace; the last range to arrive sums them in range
// order (split_reduction.cuh) and stores the tile. Fewer N-blocks per row of A then read A fewer times.
#pragma once
#include <deepgemm/epilogue/contiguous_padding.cuh>
#include <deepgemm/epilogue/split_reduction.cuh>
#include <deepgemm/epilogue/store_fragment.cuh>
#include <deepgemm/pipeline/stage_ring.cuh>
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/ptx/tma.cuh>
#include <deepgemm/ptx/wgmma.cuh>
#include <deepgemm/ptx/wgmma_bf16.cuh>
#include <deepgemm/scheduler/kgrouped_tiles.cuh>
#include <deepgemm/scheduler/tile_sources.cuh>

namespace deepgemm {

// The addend's element type (a compile-time choice; the pointer may still be null for "no addend").
enum Bf16Addend : u32 { kAddendNone = 0, kAddendBf16 = 1, kAddendFp32 = 2, kAddendInPlace = 3 };

struct Bf16GemmProblem {
    GemmProblem tiles;  // m: rows of A (dense, contiguous M_total) or M (k-grouped); grouping: m_indices, psum,
                        // masked_m or the k-grouped offsets [G + 1]; num_groups; max_m (masked)
    const void* c;      // addend [M, N] (k-grouped [G, M, N]) with row stride c_stride elements, or null
    u32 c_stride;
};

// The BF16 tile as the contiguous layouts' padding rows see it: one 64-row wave per math warpgroup, stored in
// kTileStoreN-column chunks.
template <u32 kTileM, u32 kTileN, u32 kTileStoreN, GemmKind kTileKind, typename TileStore>
struct Bf16PaddingTile {
    static constexpr u32 kBlockM = kTileM;
    static constexpr u32 kBlockN = kTileN;
    static constexpr u32 kStoreN = kTileStoreN;
    static constexpr u32 kStoreChunks = kTileN / kTileStoreN;
    static constexpr u32 kNumWaves = 1;
    static constexpr GemmKind kKind = kTileKind;
    using Store = TileStore;
    DG_DEVICE static constexpr u32 wave_row(u32, u32 math_wg) { return math_wg * 64; }
};

// The BF16 tile as the split reduction sees it: one 64-row wave per math warpgroup.
template <u32 kTileN, u32 kMathWarpgroups>
struct Bf16SplitShape {
    static constexpr u32 kBlockN = kTileN;
    static constexpr u32 kNumWaves = 1;
    static constexpr u32 kNumMathWarpgroups = kMathWarpgroups;
    static constexpr TailMode kTail = TailMode::kSplit;
};

template <u32 kN, u32 kK, u32 kBlockM, u32 kBlockN, u32 kNumStages, u32 kGroupRows, bool kAMnMajor, bool kBMnMajor,
          bool kOutputFp32, u32 kAddend, GemmKind kKind = GemmKind::kDense, bool kSplitK = false, u32 kStoreN_ = 0>
struct Sm90Bf16Gemm {
    static constexpr bool kMGrouped = kKind != GemmKind::kDense && kKind != GemmKind::kKGrouped;
    static constexpr bool kContiguous = kKind == GemmKind::kGroupedContiguous || kKind == GemmKind::kGroupedContiguousPsum;
    static constexpr bool kKGrouped = kKind == GemmKind::kKGrouped;
    static_assert(kBlockM == 64 || kBlockM == 128, "block_m is one or two 64-row math warpgroups");
    static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 256, "block_n must be a multiple of 8 in [8, 256]");
    static_assert(!kBMnMajor || kBlockN % 64 == 0, "an MN-major B tile is whole 64-column atoms");
    static_assert((kK > 0 || kKGrouped) && kN % 8 == 0, "K > 0 (K = 0 never launches) and N % 8 == 0 (16-byte output rows)");
    static_assert(kNumStages >= 2, "need at least two pipeline stages");
    static_assert(!kMGrouped || (!kAMnMajor && !kBMnMajor && kAddend == kAddendNone), "M-grouped kinds are NT without C");
    static_assert(!kKGrouped || (kAMnMajor && kBMnMajor && kOutputFp32 && kAddend != kAddendBf16),
                  "k-grouped is TN (token-major operands) into FP32, with an FP32 C or none");
    static_assert(!kSplitK || kKind == GemmKind::kDense, "split-K is a dense GEMM's");
    static_assert(kAddend != kAddendInPlace || kOutputFp32, "in-place reduce-add stores are FP32 (one rounding per element)");
    static constexpr u32 kStoreN = kStoreN_ == 0 ? kBlockN : kStoreN_;  // output columns per staging buffer
    static_assert(kBlockN % kStoreN == 0 && kStoreN % 8 == 0, "store chunks tile block_n in whole 8-column MMA steps");
    static constexpr u32 kStoreChunks = kBlockN / kStoreN;
    static constexpr u32 kStoreBuffers = kStoreChunks > 1 ? 2 : 1;

    static constexpr u32 kBlockK = 64;  // 128 bytes: one swizzled row of a K-major tile
    static constexpr u32 kAtom = 64;    // MN elements per 128-byte row of an MN-major tile
    static constexpr u32 kNumMathWarpgroups = kBlockM / 64;
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumThreads = 128 + kNumMathThreads;
    static constexpr u32 kNumKBlocks = ceil_div(kK, kBlockK);
    static constexpr u32 kNumNBlocks = ceil_div(kN, kBlockN);
    static constexpr u32 kProducerRegisters = 40;
    // A dense K-major A's last M-block is loaded through tma_a_last (its box: dense_last_box_rows); MN-major A
    // boxes are whole 64-element atoms along M, and the grouped kinds walk their own rows.
    static constexpr bool kLastBoxA = kKind == GemmKind::kDense && !kAMnMajor;
    static constexpr u32 kMathRegisters = kNumMathWarpgroups == 2 ? 232 : 240;

    using Mma = ptx::WgmmaBf16<kBlockN>;
    using Ring = StageRing<kNumStages>;
    using Store = WarpgroupTileStore<kStoreN, kOutputFp32, kStoreBuffers, kKGrouped ? 3 : 2, kAddend == kAddendInPlace>;

    using Padding = PaddingRows<Bf16PaddingTile<kBlockM, kBlockN, kStoreN, kKind, Store>>;
    using Reduction = SplitReduction<Bf16SplitShape<kBlockN, kNumMathWarpgroups>>;

    // Shared memory: A stages, B stages, each math warpgroup's output staging buffers, the ring's barriers,
    // split-K: one reduction flag per math warpgroup.
    static constexpr u32 kStageABytes = kBlockM * kBlockK * 2;
    static constexpr u32 kStageBBytes = kBlockN * kBlockK * 2;
    static constexpr u32 kWarpgroupABytes = 64 * kBlockK * 2;  // a warpgroup's 64 rows (K-major) or atom (MN-major)
    static constexpr u32 kOffsetA = 0;
    static constexpr u32 kOffsetB = kOffsetA + kNumStages * kStageABytes;
    static constexpr u32 kOffsetD = kOffsetB + kNumStages * kStageBBytes;
    static constexpr u32 kWarpgroupDBytes = kStoreBuffers * Store::kBytes;
    static constexpr u32 kOffsetBarriers = kOffsetD + kNumMathWarpgroups * kWarpgroupDBytes;
    static constexpr u32 kOffsetFlags = kOffsetBarriers + 2 * kNumStages * 8;
    static constexpr u32 kSmemBytes = kOffsetFlags + (kSplitK ? 16 : 0);
    static_assert(kStageBBytes % 1024 == 0 && Store::kBytes % 1024 == 0, "swizzled tiles stay 1024-byte aligned");
    static_assert(kSmemBytes <= 232448, "shared memory budget (227 KB) exceeded: use fewer stages");

    // Descriptor steps per 16 K inside a stage: 32 bytes along a K-major row, 16 rows of 128 bytes MN-major.
    static constexpr u64 kStepA = kAMnMajor ? (16 * 128) >> 4 : 32 >> 4;
    static constexpr u64 kStepB = kBMnMajor ? (16 * 128) >> 4 : 32 >> 4;

    // A tile of the kind's sequence with its K range (k-grouped: the group's; split-K: the unit's; else all of K).
    struct Tile {
        GroupedTile tile;  // group, m_block, n_block; row_begin / rows: the group's rows of A and D; padding
        u32 k_begin;       // in elements
        u32 k_blocks;
        SplitUnit unit;    // split-K: the tile's K range among its splits
    };

    struct Tiles {
        using Whole = TileSource<kKGrouped ? GemmKind::kDense : kKind, kBlockM, kNumNBlocks, kGroupRows, 1, 1, false>;
        using Split = SplitTailTileSource<SplitTailTileScheduler<kBlockM, kNumNBlocks, kGroupRows, kNumKBlocks>>;
        using Source = typename SelectType<kKGrouped, KGroupedTileScheduler<kNumNBlocks, kBlockK, kGroupRows>,
                                           typename SelectType<kSplitK, Split, Whole>::Type>::Type;
        Source source;
        u32 m;

        DG_DEVICE static Source make(const GemmProblem& p) {
            if constexpr (kKGrouped) {
                return Source(p.grouping, p.num_groups, ceil_div(p.m, kBlockM));
            } else {
                return Source(p, 0);
            }
        }

        DG_DEVICE explicit Tiles(const GemmProblem& p) : source(make(p)), m(p.m) {}

        DG_DEVICE bool next(Tile& t) {
            if constexpr (kKGrouped) {
                KGroupedTile k_tile;
                if (!source.next(k_tile)) {
                    return false;
                }
                t.tile.group = k_tile.group;
                t.tile.m_block = k_tile.m_block;
                t.tile.n_block = k_tile.n_block;
                t.tile.row_begin = 0;
                t.tile.rows = m;
                t.tile.padding = false;
                t.k_begin = k_tile.k_begin;
                t.k_blocks = k_tile.k_blocks;
                return true;
            } else {
                if (!source.next(t.tile, t.unit)) {
                    return false;
                }
                t.k_begin = kSplitK ? t.unit.k_begin * kBlockK : 0;
                t.k_blocks = kSplitK ? t.unit.k_end - t.unit.k_begin : kNumKBlocks;
                return true;
            }
        }
    };

    DG_DEVICE static u64 descriptor(const u8* tile, bool mn_major) {
        return mn_major ? ptx::make_smem_desc_mn_major_sw128(tile, kBlockK) : ptx::make_smem_desc_k_major_sw128(tile);
    }

    // One operand's stage: a K-major box [rows, 64 K] at (k, row), or MN-major atoms [64 K, 64 MN] at (row + 64 j, k).
    template <bool kMnMajor, u32 kRows>
    DG_DEVICE static void load_operand(u8* smem, const TmaDescriptor* desc, u64* full, i32 k, i32 row) {
        if constexpr (kMnMajor) {
#pragma unroll
            for (u32 j = 0; j < kRows / kAtom; ++j) {
                ptx::tma_load_2d(smem + j * kAtom * kBlockK * 2, desc, full, row + static_cast<i32>(j * kAtom), k);
            }
        } else {
            ptx::tma_load_2d(smem, desc, full, k, row);
        }
    }

    DG_DEVICE static void producer(const Ring& ring, const TmaDescriptor* tma_a, const TmaDescriptor* tma_a_last,
                                   const TmaDescriptor* tma_b, const GemmProblem& problem) {
        Tiles tiles(problem);
        Tile t;
        u32 stage = 0;
        u32 phase = 0;
        const u32 last_m_block = ceil_div(max(problem.m, 1u), kBlockM) - 1;
        const u32 last_tx_bytes = dense_last_box_rows<kBlockM>(problem.m) * kBlockK * 2 + kStageBBytes;
        while (tiles.next(t)) {
            if (kContiguous && t.tile.padding) {
                continue;  // stored as zeros, nothing read
            }
            const i32 row_a = static_cast<i32>(t.tile.row_begin + t.tile.m_block * kBlockM);
            // M-grouped B is [G * N, K]: an N tail box reads the next expert's rows only for columns past N.
            const i32 row_b = static_cast<i32>((kMGrouped ? t.tile.group * kN : 0) + t.tile.n_block * kBlockN);
            const bool last_box = kLastBoxA && t.tile.m_block == last_m_block;
            const TmaDescriptor* desc_a = last_box ? tma_a_last : tma_a;
            const u32 tx_bytes = last_box ? last_tx_bytes : kStageABytes + kStageBBytes;
            for (u32 k_block = 0; k_block < t.k_blocks; ++k_block) {
                ptx::mbarrier_wait(&ring.empty[stage], phase ^ 1);
                u64* full = &ring.full[stage];
                const i32 k = static_cast<i32>(t.k_begin + k_block * kBlockK);
                // Boxes overhanging M, N or K are zero-filled and still count all their bytes.
                ptx::mbarrier_arrive_expect_tx(full, tx_bytes);
                load_operand<kAMnMajor, kBlockM>(ring.smem + kOffsetA + stage * kStageABytes, desc_a, full, k, row_a);
                load_operand<kBMnMajor, kBlockN>(ring.smem + kOffsetB + stage * kStageBBytes, tma_b, full, k, row_b);
                Ring::advance(stage, phase);
            }
        }
    }

    DG_DEVICE static void release(const Ring& ring, u32 stage, u32 lane) {
        __syncwarp();
        if (lane == 0) {
            ptx::mbarrier_arrive(&ring.empty[stage]);
        }
    }

    // acc += C over this thread's accumulator elements of kCols columns from col0 (register 4j + r: row 16 warp +
    // lane / 4 + 8 (r / 2), column 8j + 2 (lane % 4) + r % 2); `c` is the addend's row 0, rows at or past `rows`
    // read nothing. N % 8 == 0, so a pair never straddles N.
    template <u32 kCols>
    DG_DEVICE static void add_addend(float (&acc)[kCols / 2], const void* c, u32 c_stride, u32 rows, u32 row0, u32 col0,
                                     u32 thread_in_wg) {
        const u32 warp = thread_in_wg / 32;
        const u32 lane = thread_in_wg % 32;
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 row = row0 + warp * 16 + lane / 4 + half * 8;
            if (row >= rows) {
                continue;
            }
            // One pointer per row; the columns are constant offsets from it (no per-element address registers).
            const u32 first_col = col0 + (lane % 4) * 2;
            const u64 row_offset = static_cast<u64>(row) * c_stride + first_col;
            const float* row_fp32 = static_cast<const float*>(c) + row_offset;
            const u16* row_bf16 = static_cast<const u16*>(c) + row_offset;
#pragma unroll
            for (u32 j = 0; j < kCols / 8; ++j) {
                if (kN % kBlockN != 0 && first_col + j * 8 >= kN) {
                    continue;
                }
                float2 value;
                if constexpr (kAddend == kAddendFp32) {
                    value = *reinterpret_cast<const float2*>(row_fp32 + j * 8);
                } else {
                    const u32 pair = *reinterpret_cast<const u32*>(row_bf16 + j * 8);
                    value = make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u));
                }
                acc[j * 4 + half * 2] += value.x;
                acc[j * 4 + half * 2 + 1] += value.y;
            }
        }
    }

    // The addend of kCols columns of a tile from col0: dense C [M, N]; k-grouped C[group] of [G, M, N] (in place:
    // added by the store).
    template <u32 kCols>
    DG_DEVICE static void add_tile_addend(float (&acc)[kCols / 2], const Bf16GemmProblem& problem, const GroupedTile& tile,
                                          u32 row0, u32 col0, u32 thread_in_wg) {
        if constexpr (kAddend == kAddendBf16 || kAddend == kAddendFp32) {
            if (problem.c != nullptr) {
                const u32 elem_bytes = kAddend == kAddendFp32 ? 4 : 2;
                const u64 group_bytes = static_cast<u64>(tile.group) * problem.tiles.m * problem.c_stride * elem_bytes;
                const void* c = static_cast<const u8*>(problem.c) + (kKGrouped ? group_bytes : 0);
                add_addend<kCols>(acc, c, problem.c_stride, problem.tiles.m, row0, col0, thread_in_wg);
            }
        }
    }

    DG_DEVICE static void zero(float (&acc)[kBlockN / 2]) {
#pragma unroll
        for (u32 i = 0; i < kBlockN / 2; ++i) {
            acc[i] = 0.0f;
        }
    }

    // The tile's K range (at least one K block) into acc, all of it overwritten.
    DG_DEVICE static void k_loop(const Ring& ring, u32& stage, u32& phase, const Tile& t, u32 math_wg, u32 lane,
                                 float (&acc)[kBlockN / 2]) {
        u32 previous = 0;
        for (u32 k_block = 0; k_block < t.k_blocks; ++k_block) {
            ptx::mbarrier_wait(&ring.full[stage], phase);
            const u64 desc_a = descriptor(ring.smem + kOffsetA + stage * kStageABytes + math_wg * kWarpgroupABytes, kAMnMajor);
            const u64 desc_b = descriptor(ring.smem + kOffsetB + stage * kStageBBytes, kBMnMajor);
            ptx::fence_accumulators(acc);
            ptx::wgmma_fence();
#pragma unroll
            for (u32 k = 0; k < kBlockK / 16; ++k) {
                Mma::template mma<kAMnMajor, kBMnMajor>(desc_a + k * kStepA, desc_b + k * kStepB, acc, k_block > 0 || k > 0);
            }
            ptx::wgmma_commit_group();
            if (k_block > 0) {
                ptx::wgmma_wait_group<1>();  // the previous K block's MMAs have read their stage
                release(ring, previous, lane);
            }
            previous = stage;
            Ring::advance(stage, phase);
        }
        ptx::wgmma_wait_group<0>();
        ptx::fence_accumulators(acc);
        release(ring, previous, lane);
    }

    // The tile's output from `acc`: C added (unless the stores add it), chunk by chunk through the staging buffers.
    DG_DEVICE static void store_tile(Store& store, float (&acc)[kBlockN / 2], const OutputDescriptors* tma_d,
                                     const Bf16GemmProblem& problem, const GroupedTile& tile, u32 row0, u32 col0,
                                     u32 thread_in_wg, u32 barrier_id) {
#pragma unroll
        for (u32 chunk = 0; chunk < kStoreChunks; ++chunk) {
            auto& values = *reinterpret_cast<float(*)[kStoreN / 2]>(&acc[chunk * kStoreN / 2]);
            add_tile_addend<kStoreN>(values, problem, tile, row0, col0 + chunk * kStoreN, thread_in_wg);
            store.store(values, tma_d, col0 + chunk * kStoreN, row0, thread_in_wg, barrier_id, tile.group);
        }
    }

    // A k-grouped tile of a group without tokens: out[g] = C[g] (in place: nothing to do) or zeros. Kept apart
    // from the MMA path and its accumulator (merging a zeroed accumulator into it made ptxas spill wide tiles).
    DG_DEVICE static void store_empty_tile(Store& store, const OutputDescriptors* tma_d, const Bf16GemmProblem& problem,
                                           const GroupedTile& tile, u32 row0, u32 col0, u32 thread_in_wg, u32 barrier_id) {
        if constexpr (kAddend != kAddendInPlace) {
#pragma unroll 1
            for (u32 chunk = 0; chunk < kStoreChunks; ++chunk) {
                float values[kStoreN / 2];
#pragma unroll
                for (u32 i = 0; i < kStoreN / 2; ++i) {
                    values[i] = 0.0f;
                }
                add_tile_addend<kStoreN>(values, problem, tile, row0, col0 + chunk * kStoreN, thread_in_wg);
                store.store(values, tma_d, col0 + chunk * kStoreN, row0, thread_in_wg, barrier_id, tile.group);
            }
        }
    }

    DG_DEVICE static void consumer(const Ring& ring, const OutputDescriptors* tma_d, const Bf16GemmProblem& problem) {
        const u32 math_wg = __shfl_sync(0xFFFFFFFFu, threadIdx.x / 128 - 1, 0);  // warp-uniform: kept in uniform registers
        const u32 thread_in_wg = threadIdx.x % 128;
        const u32 lane = thread_in_wg % 32;
        const u32 row_in_wg = (thread_in_wg / 32) * 16 + lane / 4;
        const u32 barrier_id = 1 + math_wg;
        Store store{ring.smem + kOffsetD + math_wg * kWarpgroupDBytes, 0};
        Tiles tiles(problem.tiles);
        Tile t;
        u32 stage = 0;
        u32 phase = 0;
        float acc[1][kBlockN / 2];
        while (tiles.next(t)) {
            const GroupedTile& tile = t.tile;
            if constexpr (kContiguous) {
                if (tile.padding) {
                    Padding::store_block(store, tma_d, tile, math_wg, thread_in_wg, barrier_id);
                    continue;
                }
            }
            const u32 row_in_group = tile.m_block * kBlockM + math_wg * 64;
            if (row_in_group >= tile.rows) {
                // This warpgroup's rows are all past the group's: keep the ring moving, compute and store nothing.
                for (u32 k_block = 0; k_block < t.k_blocks; ++k_block) {
                    ptx::mbarrier_wait(&ring.full[stage], phase);
                    release(ring, stage, lane);
                    Ring::advance(stage, phase);
                }
                continue;
            }
            if constexpr (kKGrouped) {
                if (t.k_blocks == 0) {
                    store_empty_tile(store, tma_d, problem, tile, row_in_group, tile.n_block * kBlockN, thread_in_wg,
                                     barrier_id);
                    continue;
                }
            }
            const u32 row0 = tile.row_begin + row_in_group;  // in A's / D's rows (k-grouped: in group's D)
            const typename Padding::RowGroups row_groups =
                Padding::load_row_groups(problem.tiles, row0, math_wg, math_wg * 64, row_in_wg);  // (m_indices form)
            k_loop(ring, stage, phase, t, math_wg, lane, acc[0]);
            if constexpr (kSplitK) {
                u32* flags = reinterpret_cast<u32*>(ring.smem + kOffsetFlags);
                if (!Reduction::reduce(problem.tiles, t.unit, flags, math_wg, thread_in_wg, barrier_id, acc)) {
                    continue;  // another K range of this tile sums and stores it
                }
            }

            const u32 col0 = tile.n_block * kBlockN;
            if constexpr (kContiguous) {
                Padding::zero_rows(acc, problem.tiles, tile, row0, math_wg, math_wg * 64, row_in_wg, row_groups);
            }
            store_tile(store, acc[0], tma_d, problem, tile, row0, col0, thread_in_wg, barrier_id);
        }
        Store::drain(thread_in_wg);
    }

    // tma_a_last: a dense K-major A's last M-block (kLastBoxA); other kernels never read it.
    DG_DEVICE static void run(const TmaDescriptor* tma_a, const TmaDescriptor* tma_a_last, const TmaDescriptor* tma_b,
                              const OutputDescriptors* tma_d, const Bf16GemmProblem& problem) {
        extern __shared__ __align__(1024) u8 smem[];
        const Ring ring = Ring::at(smem, kOffsetBarriers);
        if (threadIdx.x == 0) {
            ptx::tma_prefetch_descriptor(tma_a);
            if constexpr (kLastBoxA) {
                ptx::tma_prefetch_descriptor(tma_a_last);
            }
            ptx::tma_prefetch_descriptor(tma_b);
            ptx::tma_prefetch_descriptor(&tma_d->width128);
            ring.init(kNumMathThreads / 32);
        }
        __syncthreads();
        ptx::grid_dependency_wait();  // the previous kernel's writes are visible from here on
        if (threadIdx.x < 128) {
            ptx::setmaxnreg_dec<kProducerRegisters>();
            if (is_producer_thread<false>()) {  // thread 0 (an elected lane measured level, 2026-12-04)
                producer(ring, tma_a, tma_a_last, tma_b, problem.tiles);
                ptx::launch_dependents();  // this CTA's TMA loads are issued: a dependent may start its prologue
            }
        } else {
            ptx::setmaxnreg_inc<kMathRegisters>();
            consumer(ring, tma_d, problem);
        }
    }
};

}  // namespace deepgemm
