// K-grouped FP8 GEMM with "1D1D" scaling for the MoE expert weight gradient on sm_90a:
//   for every group g:  D[g] (FP32 [M, N]) = C[g] + (A_g * sfa_g) @ (B_g * sfb_g)^T
// A [M, K_total] and B [N, K_total] are e4m3, K-major; group g owns the K columns
// [k_offsets[g], k_offsets[g + 1]) of both (a multiple of 128: the groups' token segments back to back).
// Both operands carry one scale per row and 128-wide K block (sfa [K_total/128, M], sfb [K_total/128, N],
// M/N-major, loaded by TMA with each stage), so promotion scales every element by sfa[row] * sfb[col].
//
// Same structure as the 1D2D kernel: one TMA producer warpgroup (setmaxnreg 40), two 64-row math
// warpgroups (232), persistent over tiles (group, M-block, N-block) with the group's K loop per tile,
// an mbarrier ring of kNumStages stages, wgmma from 128B-swizzled shared memory, promotion on CUDA cores
// every 128 K. Epilogue, kStoreN_ != 0 (N % 4 == 0: 16-byte FP32 rows): each warpgroup stores its 64 rows
// in kStoreN-column chunks through two staging buffers by TMA on 3-D [G, M, N] descriptors (rows clipped at M,
// so a tile never spills into the next group's rows; the stores drain while the next tile's K loop runs); with
// kAddendInPlace (C is D itself) the tile is added into D by TMA reduce-add and C is never read, otherwise C
// (when given) is read into the accumulators at the tile's start. kStoreN_ 0: D written straight from
// registers with per-element bounds (any N).
#pragma once
#include <deepgemm/epilogue/store_fragment.cuh>
#include <deepgemm/pipeline/stage_ring.cuh>
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/ptx/tma.cuh>
#include <deepgemm/ptx/wgmma.cuh>
#include <deepgemm/ptx/wgmma_fp8.cuh>
#include <deepgemm/scheduler/kgrouped_tiles.cuh>

namespace deepgemm {

struct KGroupedProblem {
    const i32* k_offsets;  // [num_groups + 1], multiples of 128, non-decreasing
    u32 num_groups;
    float* d;              // [num_groups, M, N] FP32
    const float* c;        // [num_groups, M, N] FP32 or null (D = A B^T); may alias d (not with kAddendInPlace: null)
};

// kStoreN_: output columns per staging buffer of the TMA epilogue (16 or 32: 64- or 128-byte rows), or 0 for
// stores straight from registers. kGroupRows: each group's tiles in bands of that many M-blocks walking N together
// (1: N-block fastest inside an M-block).
template <u32 kM, u32 kN, u32 kBlockN, u32 kNumStages, bool kAddendInPlace = false, u32 kStoreN_ = 0,
          u32 kGroupRows = 1>
struct Sm90Fp8GemmKGrouped1D1D {
    static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 160, "block_n must be a multiple of 16 in [16, 160]");
    // Up to 128 columns the sfa x sfb products are formed into registers while the MMAs run (one FFMA per element
    // after the wait); wider tiles have no registers for them (accumulator, partial and sfb pairs take 200 at 160
    // columns), so the products are formed after the wait, where ptxas fits them.
    static constexpr bool kEarlyScaleProducts = kBlockN <= 128;
    // The K loop unrolled by 4 (ptxas then starts the next block's wait and reads inside this block's promotion);
    // 160 columns only fit without spills rolled.
    static constexpr u32 kKLoopUnroll = kBlockN <= 144 ? 4 : 1;
    static_assert(kNumStages >= 2, "need at least two pipeline stages");
    static constexpr bool kTmaStores = kStoreN_ != 0;
    static_assert(!kTmaStores || kN % 4 == 0, "TMA stores need FP32 rows of whole 16-byte units (N % 4 == 0)");
    static_assert(kTmaStores || !kAddendInPlace, "reduce-add stores are TMA stores");
    static constexpr u32 kStoreN = kTmaStores ? kStoreN_ : 16;
    static_assert((kStoreN == 16 || kStoreN == 32) && kBlockN % kStoreN == 0, "store chunks of 16 or 32 columns");
    using Store = WarpgroupTileStore<kStoreN, true, 2, 3, kAddendInPlace>;

    static constexpr u32 kBlockM = 128;
    static constexpr u32 kBlockK = 128;
    static constexpr u32 kNumMathThreads = 256;
    static constexpr u32 kNumThreads = 128 + kNumMathThreads;
    static constexpr u32 kNumMBlocks = ceil_div(kM, kBlockM);
    static constexpr u32 kNumNBlocks = ceil_div(kN, kBlockN);
    static constexpr u32 kProducerRegisters = 40;
    static constexpr u32 kMathRegisters = 232;
    using Mma = ptx::WgmmaFp8<kBlockN>;

    // Shared memory: A/B stages (1024-byte multiples, as the 128B swizzle needs), each math warpgroup's two output
    // staging buffers (TMA stores only), then the stages' scales.
    static constexpr u32 kStageABytes = kBlockM * kBlockK;
    static constexpr u32 kStageBBytes = kBlockN * kBlockK;
    static constexpr u32 kStageSfaBytes = kBlockM * 4;
    static constexpr u32 kStageSfbBytes = align_up(kBlockN * 4, 128u);  // TMA destinations: 128-byte aligned
    static constexpr u32 kStageTxBytes = kStageABytes + kStageBBytes + kBlockM * 4 + kBlockN * 4;
    static constexpr u32 kWarpgroupDBytes = kTmaStores ? 2 * Store::kBytes : 0;
    static constexpr u32 kOffsetA = 0;
    static constexpr u32 kOffsetB = kOffsetA + kNumStages * kStageABytes;
    static constexpr u32 kOffsetD = kOffsetB + kNumStages * kStageBBytes;
    static constexpr u32 kOffsetSfa = kOffsetD + 2 * kWarpgroupDBytes;
    static constexpr u32 kOffsetSfb = kOffsetSfa + kNumStages * kStageSfaBytes;
    static constexpr u32 kOffsetBarriers = kOffsetSfb + kNumStages * kStageSfbBytes;
    static constexpr u32 kSmemBytes = kOffsetBarriers + 2 * kNumStages * 8;
    static_assert(kStageBBytes % 1024 == 0, "B stages (and the staging buffers after them) stay 1024-byte aligned");
    static_assert(Store::kBytes % 1024 == 0, "staging buffers are whole swizzle patterns (1024 bytes)");
    static_assert(kSmemBytes <= 232448, "shared memory budget (227 KB) exceeded: use fewer stages");

    using Tiles = KGroupedTileScheduler<kNumNBlocks, kBlockK, kGroupRows>;
    using Tile = KGroupedTile;

    using Ring = StageRing<kNumStages>;

    DG_DEVICE static void producer(const Ring& ring, const TmaDescriptor* tma_a, const TmaDescriptor* tma_b,
                                   const TmaDescriptor* tma_sfa, const TmaDescriptor* tma_sfb,
                                   const KGroupedProblem& problem) {
        Tiles tiles(problem.k_offsets, problem.num_groups, kNumMBlocks);
        Tile tile;
        u32 stage = 0;
        u32 phase = 0;
        while (tiles.next(tile)) {
            const i32 row_a = static_cast<i32>(tile.m_block * kBlockM);
            const i32 row_b = static_cast<i32>(tile.n_block * kBlockN);
            for (u32 k_block = 0; k_block < tile.k_blocks; ++k_block) {
                ptx::mbarrier_wait(&ring.empty[stage], phase ^ 1);
                u64* full = &ring.full[stage];
                const i32 k = static_cast<i32>(tile.k_begin + k_block * kBlockK);
                const i32 scale_row = k / static_cast<i32>(kBlockK);
                ptx::mbarrier_arrive_expect_tx(full, kStageTxBytes);
                ptx::tma_load_2d(ring.smem + kOffsetA + stage * kStageABytes, tma_a, full, k, row_a);
                ptx::tma_load_2d(ring.smem + kOffsetB + stage * kStageBBytes, tma_b, full, k, row_b);
                ptx::tma_load_2d(ring.smem + kOffsetSfa + stage * kStageSfaBytes, tma_sfa, full, row_a, scale_row);
                ptx::tma_load_2d(ring.smem + kOffsetSfb + stage * kStageSfbBytes, tma_sfb, full, row_b, scale_row);
                Ring::advance(stage, phase);
            }
        }
    }

    DG_DEVICE static void consumer(const Ring& ring, const OutputDescriptors* tma_d,
                                   const KGroupedProblem& problem) {
        const u32 math_wg = __shfl_sync(0xFFFFFFFFu, threadIdx.x / 128 - 1, 0);  // warp-uniform: kept in uniform registers
        const u32 thread_in_wg = threadIdx.x % 128;
        const u32 lane = thread_in_wg % 32;
        const u32 row_in_wg = (thread_in_wg / 32) * 16 + lane / 4;  // and row_in_wg + 8
        const u32 col_in_8 = (lane % 4) * 2;                        // and col_in_8 + 1, in every 8 columns
        const u32 barrier_id = 1 + math_wg;
        Store store{ring.smem + kOffsetD + math_wg * kWarpgroupDBytes, 0};

        Tiles tiles(problem.k_offsets, problem.num_groups, kNumMBlocks);
        Tile tile;
        u32 stage = 0;
        u32 phase = 0;
        while (tiles.next(tile)) {
            const u32 row_base = tile.m_block * kBlockM + math_wg * 64;
            const u32 col_base = tile.n_block * kBlockN;
            const u64 group_offset = static_cast<u64>(tile.group) * kM * kN;

            // result = C (or 0; in place: 0, the stores add it to D), in the wgmma accumulator layout: register
            // 4j + r holds row row_in_wg + 8 (r / 2), column 8j + col_in_8 + r % 2.
            float result[kBlockN / 2];
#pragma unroll
            for (u32 j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 row = row_base + row_in_wg + half * 8;
                    const u32 col = col_base + j * 8 + col_in_8;
                    float lo = 0.0f;
                    float hi = 0.0f;
                    if (!kAddendInPlace && problem.c != nullptr && row < kM) {
                        const float* src = problem.c + group_offset + static_cast<u64>(row) * kN + col;
                        if (col < kN) lo = src[0];
                        if (col + 1 < kN) hi = src[1];
                    }
                    result[j * 4 + half * 2] = lo;
                    result[j * 4 + half * 2 + 1] = hi;
                }
            }

            float partial[kBlockN / 2];
#pragma unroll kKLoopUnroll
            for (u32 k_block = 0; k_block < tile.k_blocks; ++k_block) {
                ptx::mbarrier_wait(&ring.full[stage], phase);
                const float* sfa = reinterpret_cast<const float*>(ring.smem + kOffsetSfa + stage * kStageSfaBytes);
                const float* sfb = reinterpret_cast<const float*>(ring.smem + kOffsetSfb + stage * kStageSfbBytes);
                const u32 start_a = ptx::smem_desc_start(ring.smem + kOffsetA) + stage * (kStageABytes >> 4) +
                                    math_wg * 64 * (kBlockK >> 4);
                const u32 start_b = ptx::smem_desc_start(ring.smem + kOffsetB) + stage * (kStageBBytes >> 4);
                // Scales first: these generic-proxy reads of the stage must be complete long before the
                // release lets TMA (the async proxy) overwrite it.
                const float scale_lo = sfa[math_wg * 64 + row_in_wg];
                const float scale_hi = sfa[math_wg * 64 + row_in_wg + 8];
                float2 scale_b[kBlockN / 8];
#pragma unroll
                for (u32 j = 0; j < kBlockN / 8; ++j) {
                    scale_b[j] = *reinterpret_cast<const float2*>(sfb + j * 8 + col_in_8);
                }
                ptx::mma_k128_block<Mma>(start_a, start_b, partial);
                // sfa[row] x sfb[col] for this thread's elements, formed while the MMAs run (kEarlyScaleProducts):
                // after the wait the promotion is one FFMA per element instead of an FMUL and an FFMA.
                float scale[kEarlyScaleProducts ? kBlockN / 2 : 1];
                if constexpr (kEarlyScaleProducts) {
#pragma unroll
                    for (u32 j = 0; j < kBlockN / 8; ++j) {
                        scale[j * 4 + 0] = scale_lo * scale_b[j].x;
                        scale[j * 4 + 1] = scale_lo * scale_b[j].y;
                        scale[j * 4 + 2] = scale_hi * scale_b[j].x;
                        scale[j * 4 + 3] = scale_hi * scale_b[j].y;
                    }
                }
                ptx::wgmma_wait_group<0>();
                ptx::fence_accumulators(partial);
                __syncwarp();
                if (lane == 0) {
                    ptx::mbarrier_arrive(&ring.empty[stage]);
                }
                Ring::advance(stage, phase);
                if constexpr (kEarlyScaleProducts) {
#pragma unroll
                    for (u32 i = 0; i < kBlockN / 2; ++i) {
                        result[i] += scale[i] * partial[i];
                    }
                } else {
                    // The same rounding as the early products: (sfa x sfb) first, then one FFMA.
#pragma unroll
                    for (u32 j = 0; j < kBlockN / 8; ++j) {
                        result[j * 4 + 0] += (scale_lo * scale_b[j].x) * partial[j * 4 + 0];
                        result[j * 4 + 1] += (scale_lo * scale_b[j].y) * partial[j * 4 + 1];
                        result[j * 4 + 2] += (scale_hi * scale_b[j].x) * partial[j * 4 + 2];
                        result[j * 4 + 3] += (scale_hi * scale_b[j].y) * partial[j * 4 + 3];
                    }
                }
            }

            if constexpr (kTmaStores) {
                if (kAddendInPlace && tile.k_blocks == 0) {
                    continue;  // a group without tokens adds nothing to its D
                }
                // Chunk by chunk through the staging buffers (a chunk's shared-memory writes overlap the previous
                // chunk's store); TMA clips the rows past M and the columns past N.
#pragma unroll
                for (u32 chunk = 0; chunk < kBlockN / kStoreN; ++chunk) {
                    const auto& values = *reinterpret_cast<const float(*)[kStoreN / 2]>(&result[chunk * kStoreN / 2]);
                    store.store(values, tma_d, col_base + chunk * kStoreN, row_base, thread_in_wg, barrier_id,
                                tile.group);
                }
                continue;
            }
            // D straight from registers: a warp writes 8 rows x 32 contiguous bytes per instruction.
#pragma unroll
            for (u32 j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 row = row_base + row_in_wg + half * 8;
                    const u32 col = col_base + j * 8 + col_in_8;
                    if (row >= kM || col >= kN) {
                        continue;
                    }
                    float* dst = problem.d + group_offset + static_cast<u64>(row) * kN + col;
                    const float lo = result[j * 4 + half * 2];
                    const float hi = result[j * 4 + half * 2 + 1];
                    if constexpr (kN % 2 == 0) {
                        *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);  // col is even, so is kN
                    } else {
                        dst[0] = lo;
                        if (col + 1 < kN) dst[1] = hi;
                    }
                }
            }
        }
        if constexpr (kTmaStores) {
            Store::drain(thread_in_wg);
        }
    }

    DG_DEVICE static void run(const TmaDescriptor* tma_a, const TmaDescriptor* tma_b, const TmaDescriptor* tma_sfa,
                              const TmaDescriptor* tma_sfb, const OutputDescriptors* tma_d,
                              const KGroupedProblem& problem) {
        extern __shared__ __align__(1024) u8 smem[];
        const Ring ring = Ring::at(smem, kOffsetBarriers);
        if (threadIdx.x == 0) {
            ptx::tma_prefetch_descriptor(tma_a);
            ptx::tma_prefetch_descriptor(tma_b);
            ptx::tma_prefetch_descriptor(tma_sfa);
            ptx::tma_prefetch_descriptor(tma_sfb);
            if constexpr (kTmaStores) {
                ptx::tma_prefetch_descriptor(kStoreN == 32 ? &tma_d->width128 : &tma_d->width64);
            }
            ring.init(kNumMathThreads / 32);
        }
        __syncthreads();
        ptx::grid_dependency_wait();  // the previous kernel's writes are visible from here on
        if (threadIdx.x < 128) {
            ptx::setmaxnreg_dec<kProducerRegisters>();
            if (is_producer_thread<false>()) {  // thread 0
                producer(ring, tma_a, tma_b, tma_sfa, tma_sfb, problem);
                ptx::launch_dependents();  // this CTA's TMA loads are issued: a dependent may start its prologue
            }
        } else {
            ptx::setmaxnreg_inc<kMathRegisters>();
            consumer(ring, tma_d, problem);
        }
    }
};

}  // namespace deepgemm
