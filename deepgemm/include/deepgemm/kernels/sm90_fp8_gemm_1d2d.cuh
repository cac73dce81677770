// FP8 (e4m3) GEMM with DeepSeek-V3 fine-grained scaling on sm_90a:
//   D[M,N] = (A * sfa) @ (B * sfb)^T,  A [M,K] e4m3 with 1x128 scales sfa, B [N,K] e4m3 with 128x128 scales sfb.
// Every 128-wide K block is multiplied by wgmma into a fresh FP32 accumulator, then promoted into the
// output accumulator with its scales on the CUDA cores (never one long FP8 accumulation).
//
// Roles (one CTA = 1 producer warpgroup + kBlockM/64 math warpgroups, persistent over tiles):
//   producer  - one thread issues TMA loads of A, B (128B swizzle) and sfa into a kNumStages ring; with
//               kClusterM = 2 the two CTAs of a cluster compute vertically adjacent tiles and each loads
//               half of the shared B tile, multicast into both CTAs (half the L2 traffic for B);
//   tile loader - with two or three math warpgroups, the producer warpgroup's second warp runs their
//               tile schedule and publishes each tile, with its sfb (one or two rows of ceil(K/128)
//               floats), in one of two shared slots a tile ahead: a tile start never waits on a global
//               load (one math warpgroup schedules its own tiles);
//   consumer  - each math warpgroup owns 64 rows of the tile (block_m 256: two 64-row "waves", rows
//               128v + 64w for wave v of warpgroup w, sharing the stage's B tile): wgmma from shared
//               memory, release the stage, then promote with sfa (per row, from the stage) x sfb (per
//               128 columns); with kPipelinedPromotion the next K block's MMAs are issued into a second
//               accumulator first. block_m 256 serves dense GEMMs, masked groups (a group's last tile
//               skips the waves past its rows) and the contiguous layout (a block whose two 128-row
//               halves hold different experts runs as two half tiles, see grouped_tiles.cuh);
//   epilogue  - registers -> shared memory -> TMA store (clipped at the tensor's edges); with kOverlapStores
//               each wave is stored while the next MMAs run (see there).
// M is a run-time value; N, K and every tile constant are compile-time.
#pragma once
#include <deepgemm/epilogue/store_fragment.cuh>
#include <deepgemm/ptx/cluster.cuh>
#include <deepgemm/pipeline/stage_ring.cuh>
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/ptx/tma.cuh>
#include <deepgemm/ptx/wgmma.cuh>
#include <deepgemm/ptx/wgmma_fp8.cuh>
#include <deepgemm/scheduler/grouped_tiles.cuh>
#include <deepgemm/scheduler/persistent_tiles.cuh>

namespace deepgemm {

// Which rows of A/D and which B a tile uses (B is [G, N, K] for the grouped kinds).
enum class GemmKind : int { kDense = 0, kGroupedContiguous = 1, kGroupedMasked = 2, kGroupedContiguousPsum = 3 };

// How a dense GEMM's last partial wave runs: as whole tiles, split evenly along K (SplitTailTileScheduler),
// or cut into heads on their own CTAs and ends on the CTAs the wave leaves idle (StreamTailTileScheduler).
enum class TailMode : int { kWhole = 0, kSplit = 1, kStream = 2 };

// Run-time problem description: dense uses m; contiguous uses m (total rows) and grouping = m_indices
// (or, psum form, grouping = the groups' cumulative end rows);
// masked uses grouping = masked_m [num_groups] with max_m rows per group.
struct GemmProblem {
    u32 m;
    const i32* grouping;
    u32 num_groups;
    u32 max_m;
    float* workspace;  // split/stream tail: FP32 partials, one slot per split unit (stream: per tail tile)
    u32* counters;     // split/stream tail: arrivals per (tail tile, math warpgroup); zero between launches
};

// One tile sequence per kind, as GroupedTile records (dense: group 0, no padding). kRotateWaves: the contiguous
// walk's rotation (ContiguousBlockWalk), for kernels whose last N-block is narrow; the other kinds ignore it.
template <GemmKind kKind, u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, bool kRotateWaves>
struct TileSource;

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, bool kRotateWaves>
struct TileSource<GemmKind::kDense, kBlockM, kNumNBlocks, kGroupM, kClusterM, kRotateWaves> {
    PersistentTileScheduler<kBlockM, kNumNBlocks, kGroupM, kClusterM> scheduler;
    u32 m;

    DG_DEVICE TileSource(const GemmProblem& p, u32 cta_rank) : scheduler(p.m, cta_rank), m(p.m) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit&) {
        tile.group = 0;
        tile.row_begin = 0;
        tile.rows = m;
        tile.padding = false;
        return scheduler.next(tile.m_block, tile.n_block);
    }
};

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, bool kRotateWaves>
struct TileSource<GemmKind::kGroupedContiguous, kBlockM, kNumNBlocks, kGroupM, kClusterM, kRotateWaves> {
    ContiguousTileScheduler<kBlockM, kNumNBlocks, kRotateWaves> scheduler;

    DG_DEVICE TileSource(const GemmProblem& p, u32) : scheduler(p.grouping, p.m, p.num_groups) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit&) { return scheduler.next(tile); }
};

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, bool kRotateWaves>
struct TileSource<GemmKind::kGroupedContiguousPsum, kBlockM, kNumNBlocks, kGroupM, kClusterM, kRotateWaves> {
    ContiguousPsumTileScheduler<kBlockM, kNumNBlocks, kRotateWaves> scheduler;

    DG_DEVICE TileSource(const GemmProblem& p, u32) : scheduler(p.grouping, p.m, p.num_groups) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit&) { return scheduler.next(tile); }
};

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, bool kRotateWaves>
struct TileSource<GemmKind::kGroupedMasked, kBlockM, kNumNBlocks, kGroupM, kClusterM, kRotateWaves> {
    MaskedTileScheduler<kBlockM, kNumNBlocks> scheduler;

    DG_DEVICE TileSource(const GemmProblem& p, u32) : scheduler(p.grouping, p.num_groups, p.max_m) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit&) { return scheduler.next(tile); }
};

// Dense tiles with the last partial wave split along K (SplitTailTileScheduler or StreamTailTileScheduler).
template <typename Scheduler>
struct SplitTailTileSource {
    Scheduler scheduler;
    u32 m;

    DG_DEVICE SplitTailTileSource(const GemmProblem& p, u32) : scheduler(p.m), m(p.m) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit& unit) {
        tile.group = 0;
        tile.row_begin = 0;
        tile.rows = m;
        tile.padding = false;
        return scheduler.next(tile.m_block, tile.n_block, unit);
    }
};

template <bool kFirst, typename First, typename Second>
struct SelectType {
    using Type = First;
};
template <typename First, typename Second>
struct SelectType<false, First, Second> {
    using Type = Second;
};

template <u32 kN, u32 kK, u32 kBlockM, u32 kBlockN, u32 kNumStages, u32 kGroupM, u32 kClusterM, bool kPipelinedPromotion,
          bool kOutputFp32, GemmKind kKind = GemmKind::kDense, TailMode kTail = TailMode::kWhole, bool kChunkedStore = false>
struct Sm90Fp8Gemm1D2D {
    static constexpr bool kSplitTail = kTail != TailMode::kWhole;  // some units are K ranges of a tile
    static_assert(!kSplitTail || (kKind == GemmKind::kDense && kClusterM == 1),
                  "the split and stream tails are for dense GEMMs without clusters");
    static_assert(kBlockM == 64 || kBlockM == 128 || kBlockM == 192 || kBlockM == 256, "block_m must be 64, 128, 192 or 256");
    static_assert(kBlockM != 192 || (!kPipelinedPromotion && kClusterM == 1 && kKind == GemmKind::kDense),
                  "block_m 192 (three math warpgroups, 160 registers each) is dense only, unpipelined, without clusters");
    static_assert(kBlockM != 256 || (!kPipelinedPromotion && 128 % kBlockN == 0),
                  "block_m 256 (two waves per warpgroup) is unpipelined, with block_n dividing 128");
    static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 256, "block_n must be a multiple of 8 in [8, 256]");
    static_assert(kNumStages >= 2, "need at least two pipeline stages");
    static_assert(kClusterM == 1 || (kClusterM == 2 && kBlockN % 16 == 0), "multicast halves of B need block_n % 16 == 0");
    static_assert(kClusterM == 1 || kKind == GemmKind::kDense, "grouped GEMMs run without clusters");
    // Tiles start at multiples of block_n, so a tile's offset inside its 128-column scale block is at most
    // 128 - gcd(block_n, 128); it must not reach a third scale block.
    static_assert(128 - gcd(kBlockN, 128u) + kBlockN <= 256, "block_n would let a tile span three 128-column scale blocks");

    static constexpr u32 kBlockK = 128;
    static constexpr u32 kScaleBlock = 128;
    // block_m 192: three warpgroups of 64 rows, so while two promote or wait, the third keeps the tensor cores fed.
    static constexpr u32 kNumMathWarpgroups = kBlockM == 64 ? 1 : (kBlockM == 192 ? 3 : 2);
    static constexpr u32 kNumWaves = kBlockM / (64 * kNumMathWarpgroups);  // 64-row MMA waves per warpgroup
    static constexpr u32 kNumMathThreads = 128 * kNumMathWarpgroups;
    static constexpr u32 kNumThreads = 128 + kNumMathThreads;
    static constexpr u32 kNumKBlocks = ceil_div(kK, kBlockK);
    static constexpr u32 kNumNBlocks = ceil_div(kN, kBlockN);
    static constexpr u32 kNumScaleRowsB = ceil_div(kN, kScaleBlock);
    // A tile straddles two 128-column scale blocks unless block_n divides 128.
    static constexpr bool kMayStraddle = (kScaleBlock % kBlockN) != 0;
    static constexpr u32 kScaleRowsPerTile = kMayStraddle ? 2 : 1;
    // Tiles start at multiples of block_n, so the column where a tile switches to the next scale block
    // (128 - col0 % 128) is a multiple of gcd(block_n, 128) in [gcd, 128]. With at most four such values the
    // K loop is compiled once per value and the promotion picks each column's scale at compile time;
    // otherwise it selects per 8 columns at run time (only for the columns whose choice varies).
    static constexpr u32 kStraddleStep = gcd(kBlockN, kScaleBlock);
    static constexpr u32 kNumStraddleCols = kMayStraddle ? kScaleBlock / kStraddleStep : 1;
    static constexpr bool kStaticStraddle = kNumStraddleCols <= 4;

    // 64K registers per SM: 128 x 40 + 256 x 232 for two math warpgroups, 128 x 32 + 384 x 160 for three
    // (exactly 64K: 512 threads launch with 128 each), 128 x 56 + 128 x 240 for one. With two or three math
    // warpgroups the producer warpgroup runs the TMA thread and the tile loader warp, each with its own
    // tile scheduler (24 registers spilled in the loader); one math warpgroup has no loader, and 56 is
    // simply more than its TMA thread needs (40 spilled with NVRTC 13.0 while it still had one).
    static constexpr u32 kProducerRegisters = kNumMathWarpgroups == 1 ? 56 : (kNumMathWarpgroups == 3 ? 32 : 40);
    static constexpr u32 kMathRegisters = kNumMathWarpgroups == 1 ? 240 : (kNumMathWarpgroups == 3 ? 160 : 232);

    // Output staging. block_m 256 gives each warpgroup one full-width buffer per wave, used in turn, so a
    // tile's stores never wait for each other (only a buffer's previous store, a tile earlier); where that
    // leaves fewer than three stages (FP32 output) kChunkedStore stores each wave in 128-byte-wide column
    // chunks through one 8 KB buffer per warpgroup instead, each chunk waiting for the one before.
    static_assert(!kChunkedStore || kBlockM == 256, "chunked stores are a block_m 256 layout");
    static constexpr u32 kStoreN = kChunkedStore ? (kBlockN < (kOutputFp32 ? 32u : 64u) ? kBlockN : (kOutputFp32 ? 32u : 64u)) : kBlockN;
    static constexpr u32 kStoreChunks = kBlockN / kStoreN;
    static constexpr u32 kStoreBuffers = kChunkedStore ? 1 : kNumWaves;
    static_assert(kBlockN % kStoreN == 0, "output chunks must tile block_n");
    using Store = WarpgroupTileStore<kStoreN, kOutputFp32, kStoreBuffers>;
    // Overlapped stores: the tensor cores used to idle while both math warpgroups stored a finished tile
    // (both reach the epilogue together: they share every stage). With one accumulator per warpgroup
    // (unpipelined promotion) and the tile loader, each wave is stored while MMAs run instead: once a wave
    // is promoted for the last time it is packed to BF16 pairs (half the registers), and stored right after
    // the next MMAs are issued - wave w - 1 after the last K block's wave-w MMAs, the tile's last wave after
    // the next tile's first MMAs (until then it is "pending"). The first K block of a tile sets the results
    // instead of adding to them, so no register is zeroed or kept for the next tile. Whole dense and masked
    // tiles with BF16 output only (split/stream pieces reduce all waves first; contiguous blocks zero their
    // padding rows first).
    // K range: ptxas spilled 52-74 registers with two or three K blocks (the first and last block run straight
    // into each other); measured on the H200 (docs/perf-notes.md, v24) 0.2-1.5% faster with 4-16 K blocks,
    // level at 56 and 2.8% slower at 128 (not explained), so longer K keeps the plain epilogue.
    static constexpr bool kOverlapStores = !kPipelinedPromotion && kNumMathWarpgroups > 1 && !kSplitTail && !kChunkedStore &&
                                           !kOutputFp32 && (kNumKBlocks == 1 || (kNumKBlocks >= 4 && kNumKBlocks <= 16)) &&
                                           (kKind == GemmKind::kDense || kKind == GemmKind::kGroupedMasked);
    static_assert(!kOverlapStores || kNumWaves <= 2, "overlapped stores: at most two waves per warpgroup");

    // The last N-block, when N is not a multiple of block_n, holds only kLastBlockN columns (rounded up to 8,
    // the wgmma N step). Its tiles load B in a box of that many rows (a second descriptor: for grouped B the rows
    // past N would be the next expert's, real bytes) and issue wgmma of that width into an accumulator of their
    // own, whose fragment is the wide one's first kLastBlockN / 2 registers, so the promotion adds it into the
    // results' first registers. The columns past it are stored from stale registers and clipped by the output
    // descriptor at N. E.g. 128 x 192 tiles at N = 4096 spend 21 full blocks and one of 64 columns: the last is a
    // third of the work instead of a whole tile. (Narrow MMAs into a prefix of the wide accumulator array made
    // ptxas wait after every wgmma of every K loop at K = 7168: 26% slower; docs/perf-notes.md, v39.)
    // Contiguous layouts then rotate their walk (ContiguousBlockWalk::kRotateWaves), so the cheap tiles do not
    // all fall to the same CTAs. DEEPGEMM_NARROW_LAST_N=0 (set by the host for A/B runs) compiles full-width last
    // blocks and the plain walk.
#ifndef DEEPGEMM_NARROW_LAST_N
#define DEEPGEMM_NARROW_LAST_N 1
#endif
    static constexpr u32 kLastBlockN = align_up(kN - (kNumNBlocks - 1) * kBlockN, 8u);
    static constexpr bool kNarrowLast = DEEPGEMM_NARROW_LAST_N != 0 && kClusterM == 1 && kLastBlockN < kBlockN;
    static constexpr u32 kLastBoxRowsB = kNarrowLast ? kLastBlockN : kBlockN;
    using TailScheduler = typename SelectType<kTail == TailMode::kStream, StreamTailTileScheduler<kBlockM, kNumNBlocks, kGroupM, kNumKBlocks>,
                                              SplitTailTileScheduler<kBlockM, kNumNBlocks, kGroupM, kNumKBlocks>>::Type;
    using Tiles = typename SelectType<kSplitTail, SplitTailTileSource<TailScheduler>,
                                      TileSource<kKind, kBlockM, kNumNBlocks, kGroupM, kClusterM, kNarrowLast>>::Type;
    static constexpr u32 kMulticastRowsB = kBlockN / kClusterM;
    // Masked groups hold few valid rows at decode sizes: their A tiles are loaded in boxes of kLoadRowsA rows,
    // only as many as the tile's valid rows need (a 64-row wave reads stale shared memory in the rows past
    // them; those output rows lie past masked_m, where the result is unspecified). Other kinds load a tile in
    // one box (TMA zero-fills rows past the tensor), a dense GEMM's partial last M-block in a smaller one (below).
    static constexpr u32 kLoadRowsA = kKind == GemmKind::kGroupedMasked ? (kBlockM == 64 ? 16u : 64u) : kBlockM;
    static_assert(kBlockM % kLoadRowsA == 0, "A boxes must tile block_m");
    // A dense GEMM's last M-block, when M does not fill it, loads A and sfa through a second pair of
    // descriptors whose box is that block's rows rounded up to 8 (M itself when M is below one block: decode),
    // not kBlockM: boxes that overhang the tensor by most of their rows measured slow (M = 1 with 64-row boxes:
    // ~0.18 us more per K block than M = 64; M = 65 with 64-row blocks ran 25% slower than M = 128). One box
    // per stage either way (v32's quarter-block boxes, a loop in the producer, measured slower). The rows past
    // the box are stale shared memory; their outputs lie past M and are never stored. The host encodes the
    // same box (dense_last_box_rows in fp8_gemm.py).
    DG_DEVICE static u32 dense_last_box_rows(u32 m) {
        const u32 rows = m - (ceil_div(max(m, 1u), kBlockM) - 1) * kBlockM;
        return align_up(max(rows, 1u), 8u);
    }

    // Shared memory map. A/B stages first: each is a multiple of 1024 bytes, so every stage stays
    // 1024-byte aligned as the 128B swizzle requires.
    static constexpr u32 kStageABytes = kBlockM * kBlockK;
    static constexpr u32 kStageBBytes = kBlockN * kBlockK;
    static constexpr u32 kStageSfaBytes = kBlockM * 4;
    static constexpr u32 kStageTxBytes = kStageABytes + kStageBBytes + kStageSfaBytes;
    static constexpr u32 kDBytesPerWarpgroup = kStoreBuffers * Store::kBytes;
    // Tile slots: the loader warp fills one while the math warpgroups work on the other (all math
    // warpgroups of a CTA work on the same tile, so they share it): a 64-byte header, then sfb.
    static constexpr u32 kTileSlots = 2;
    // The loader pays off when several math warpgroups would each wait on the tile-start loads; a single
    // math warpgroup (decode-sized tiles, one tile per CTA in most launches) measured 2-4% faster
    // scheduling its own tiles (then slot 0 only stages its sfb).
    static constexpr bool kTileLoader = kNumMathWarpgroups > 1;
    static_assert(!kOverlapStores || kTileLoader, "overlapped stores rely on the tile loader's schedule");
    static constexpr u32 kSfbSlotFloats = kScaleRowsPerTile * kNumKBlocks;
    static constexpr u32 kTileSlotBytes = align_up(64 + kSfbSlotFloats * 4, 128u);
    static constexpr u32 kOffsetA = 0;
    static constexpr u32 kOffsetB = kOffsetA + kNumStages * kStageABytes;
    static constexpr u32 kOffsetD = kOffsetB + kNumStages * kStageBBytes;
    static constexpr u32 kOffsetSfa = kOffsetD + kNumMathWarpgroups * kDBytesPerWarpgroup;
    static constexpr u32 kOffsetTileSlots = kOffsetSfa + kNumStages * kStageSfaBytes;
    static constexpr u32 kOffsetFlags = kOffsetTileSlots + kTileSlots * kTileSlotBytes;  // split tail: a u32 per math warpgroup
    static constexpr u32 kOffsetBarriers = kOffsetFlags + 16;
    static constexpr u32 kOffsetSlotBarriers = kOffsetBarriers + 2 * kNumStages * 8;
    static constexpr u32 kSmemBytes = kOffsetSlotBarriers + 2 * kTileSlots * 8;
    static_assert(kNumMathWarpgroups * 4 <= 16, "split-tail flags");
    static_assert(kSmemBytes <= 232448, "shared memory budget (227 KB) exceeded: use fewer stages");

    using Ring = StageRing<kNumStages>;

    DG_DEVICE static void producer(const Ring& ring, const TmaDescriptor* tma_a, const TmaDescriptor* tma_b,
                                   const TmaDescriptor* tma_sfa, const TmaDescriptor* tma_a_last,
                                   const TmaDescriptor* tma_sfa_last, const TmaDescriptor* tma_b_last,
                                   const GemmProblem& problem, u32 cta_rank) {
        Tiles tiles(problem, cta_rank);
        GroupedTile tile;
        SplitUnit unit{0, kNumKBlocks, 1, 0, 0};
        u32 stage = 0;
        u32 phase = 0;
        // Dense: the last M-block and its stage bytes (kBlockM rows when M fills it).
        const u32 last_m_block = ceil_div(max(problem.m, 1u), kBlockM) - 1;
        const u32 last_tx_bytes = kStageBBytes + dense_last_box_rows(problem.m) * (kBlockK + 4);
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
            } else if constexpr (kKind == GemmKind::kDense) {
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
                if constexpr (kLoadRowsA == kBlockM) {
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

    // Where scale i of a tile's staged sfb comes from: row i / ceil(K/128) of the tile's one or two
    // 128-column scale blocks (the second clamped to the last row at the matrix's edge), so the address is
    // always inside the group's sfb.
    DG_DEVICE static const float* tile_sfb_source(const float* sfb, const GroupedTile& tile, u32 i) {
        const u32 row = min(tile.n_block * kBlockN / kScaleBlock + i / kNumKBlocks, kNumScaleRowsB - 1);
        return sfb + (tile.group * kNumScaleRowsB + row) * kNumKBlocks + i % kNumKBlocks;
    }

    // One tile as the loader warp publishes it: what the scheduler returned, and its sfb rows.
    struct TileSlot {
        GroupedTile tile;
        SplitUnit unit;
        u32 done;  // 1: the schedule is exhausted (the slot holds no tile)
        u32 reserved[16 - (sizeof(GroupedTile) + sizeof(SplitUnit)) / 4 - 1];
        float sfb[kSfbSlotFloats];  // kScaleRowsPerTile rows of ceil(K/128) scales
    };
    static_assert(sizeof(GroupedTile) + sizeof(SplitUnit) + 4 <= 64, "the tile header fits 64 bytes");
    static_assert(sizeof(TileSlot) <= kTileSlotBytes, "tile slot layout");

    // Two tile slots and their barriers: "full" completes when the loader warp's 32 lanes have written a
    // tile, "empty" when every math warp is done with it. Use u (u = 0, 1, ...) is slot u % 2 with phase
    // parity (u / 2) % 2; addresses are formed from the shared-memory base on use, so the math warpgroups
    // keep only the use counter live through their K loops.
    struct TileSlots {
        u8* smem;

        DG_DEVICE u64* full(u32 use) const { return reinterpret_cast<u64*>(smem + kOffsetSlotBarriers) + use % kTileSlots; }
        DG_DEVICE u64* empty(u32 use) const {
            return reinterpret_cast<u64*>(smem + kOffsetSlotBarriers) + kTileSlots + use % kTileSlots;
        }
        DG_DEVICE TileSlot* slot(u32 use) const {
            return reinterpret_cast<TileSlot*>(smem + kOffsetTileSlots + use % kTileSlots * kTileSlotBytes);
        }
        DG_DEVICE static u32 parity(u32 use) { return (use / kTileSlots) & 1; }

        DG_DEVICE void init() const {
#pragma unroll
            for (u32 s = 0; s < kTileSlots; ++s) {
                ptx::mbarrier_init(full(s), 32);
                ptx::mbarrier_init(empty(s), kNumMathThreads / 32);
            }
        }
    };

    // The producer warpgroup's second warp runs the math warpgroups' tile schedule: it publishes each tile
    // (padding blocks too) with its sfb rows (the tile's 128-column scale block and, for straddling tiles,
    // the next) a tile ahead, then a final slot marked done. The math warpgroups thus never wait on the
    // scheduler's global reads (m_indices, masked_m) or the scales' at a tile start, and hold no scheduler
    // state through their K loops.
    DG_DEVICE static void tile_loader(const TileSlots& slots, const float* sfb, const GemmProblem& problem, u32 cta_rank,
                                      u32 lane) {
        Tiles tiles(problem, cta_rank);
        GroupedTile tile;
        SplitUnit unit{0, kNumKBlocks, 1, 0, 0};
        for (u32 use = 0;; ++use) {
            const bool more = tiles.next(tile, unit);
            ptx::mbarrier_wait(slots.empty(use), TileSlots::parity(use) ^ 1);
            TileSlot* slot = slots.slot(use);
            if (lane == 0) {
                slot->tile = tile;
                slot->unit = unit;
                slot->done = more ? 0u : 1u;
            }
            if (more && !tile.padding) {
                // Batches of kBatch loads per lane in flight at once (a CTA's first tile waits for them:
                // one global round trip for up to 32 x kBatch scales, not one per 32). Not unrolled further:
                // the per-lane index math would be hoisted out of the tile loop (too many registers).
                constexpr u32 kBatch = 4;
#pragma unroll 1
                for (u32 base = 0; base < kSfbSlotFloats; base += 32 * kBatch) {
                    float values[kBatch];
#pragma unroll
                    for (u32 j = 0; j < kBatch; ++j) {
                        const u32 i = base + j * 32 + lane;
                        values[j] = i < kSfbSlotFloats ? __ldg(tile_sfb_source(sfb, tile, i)) : 0.0f;
                    }
#pragma unroll
                    for (u32 j = 0; j < kBatch; ++j) {
                        if (base + j * 32 + lane < kSfbSlotFloats) {
                            slot->sfb[base + j * 32 + lane] = values[j];
                        }
                    }
                }
            }
            ptx::mbarrier_arrive(slots.full(use));  // releases this lane's stores
            if (!more) {
                return;
            }
        }
    }

    // This warp is done with the tile in slot use `use`.
    DG_DEVICE static void release_slot(const TileSlots& slots, u32 use) {
        __syncwarp();
        if (ptx::elect_one_lane()) {
            ptx::mbarrier_arrive(slots.empty(use));
        }
    }

    // Tell the producers of every CTA sharing this stage that this warp is done with it.
    DG_DEVICE static void release_stage(const Ring& ring, u32 stage, u32 lane) {
        __syncwarp();
        if (lane == 0) {
            if constexpr (kClusterM == 1) {
                ptx::mbarrier_arrive(&ring.empty[stage]);
            } else {
#pragma unroll
                for (u32 rank = 0; rank < kClusterM; ++rank) {
                    ptx::mbarrier_arrive_cluster(&ring.empty[stage], rank);
                }
            }
        }
    }

    // sfa of this thread's two rows (row_in_wg and row_in_wg + 8) for one K block.
    struct ScaleA {
        float lo;
        float hi;
    };

    // First tile row of wave `wave` of warpgroup `math_wg`.
    DG_DEVICE static constexpr u32 wave_row(u32 wave, u32 math_wg) { return (wave * kNumMathWarpgroups + math_wg) * 64; }

    // Read this thread's sfa from a (full) stage and issue the four k32 MMAs of one 128-wide K block of one
    // wave into `partial` (kTileN columns).
    template <u32 kTileN>
    DG_DEVICE static void issue_block(const Ring& ring, u32 stage, u32 first_row, u32 row_in_wg,
                                      float (&partial)[kTileN / 2], ScaleA& scale_a) {
        const float* sfa_stage = reinterpret_cast<const float*>(ring.smem + kOffsetSfa + stage * kStageSfaBytes);
        scale_a.lo = sfa_stage[first_row + row_in_wg];
        scale_a.hi = sfa_stage[first_row + row_in_wg + 8];
        const u64 desc_a =
            ptx::make_smem_desc_k_major_sw128(ring.smem + kOffsetA + stage * kStageABytes + first_row * kBlockK);
        const u64 desc_b = ptx::make_smem_desc_k_major_sw128(ring.smem + kOffsetB + stage * kStageBBytes);
        ptx::mma_k128_block<ptx::WgmmaFp8<kTileN>>(desc_a, desc_b, partial);
        ptx::fence_accumulators(partial);
    }

    // sfb of one K block for the tile's columns (second: the next 128-column scale block, straddling tiles).
    struct ScaleB {
        float first;
        float second;
    };

    // The two row scales (sfa x sfb) of this thread's rows for both column ranges of a tile.
    struct BlockScales {
        float lo0;
        float hi0;
        float lo1;
        float hi1;
    };

    // result += (sfa x sfb) * partial for one K block. The scales are read and multiplied before the
    // block's MMAs retire, so the FFMAs start as soon as the wait returns.
    struct Promotion {
        const float* sfb_tile;
        u32 straddle_col;  // tile columns at or past this offset use the next 128-column scale block

        DG_DEVICE ScaleB scale_b(u32 k_block) const {
            ScaleB b;
            b.first = sfb_tile[k_block];
            b.second = kMayStraddle ? sfb_tile[kNumKBlocks + k_block] : b.first;
            return b;
        }

        DG_DEVICE static BlockScales combine(const ScaleA& a, const ScaleB& b) {
            return BlockScales{a.lo * b.first, a.hi * b.first, a.lo * b.second, a.hi * b.second};
        }

        // kStraddleCol: the switch column when known at compile time, 0 when only `straddle_col` knows it.
        // kTileN: the columns computed (into the first kTileN / 2 registers of `result`).
        // kSet: result = (sfa x sfb) * partial (a tile's first K block with kOverlapStores).
        template <u32 kStraddleCol, u32 kTileN, bool kSet = false>
        DG_DEVICE void apply(float (&result)[kBlockN / 2], const float (&partial)[kTileN / 2], const BlockScales& s) const {
#pragma unroll
            for (u32 j = 0; j < kTileN / 8; ++j) {
                const u32 col = j * 8;
                bool second = false;
                if constexpr (kMayStraddle && kStraddleCol != 0) {
                    second = col >= kStraddleCol;
                } else if constexpr (kMayStraddle) {
                    second = col >= kScaleBlock || (col >= kStraddleStep && col >= straddle_col);
                }
                const float lo = second ? s.lo1 : s.lo0;
                const float hi = second ? s.hi1 : s.hi0;
                if constexpr (kSet) {
                    result[j * 4 + 0] = lo * partial[j * 4 + 0];
                    result[j * 4 + 1] = lo * partial[j * 4 + 1];
                    result[j * 4 + 2] = hi * partial[j * 4 + 2];
                    result[j * 4 + 3] = hi * partial[j * 4 + 3];
                } else {
                    result[j * 4 + 0] += lo * partial[j * 4 + 0];
                    result[j * 4 + 1] += lo * partial[j * 4 + 1];
                    result[j * 4 + 2] += hi * partial[j * 4 + 2];
                    result[j * 4 + 3] += hi * partial[j * 4 + 3];
                }
            }
        }
    };

    // A math warpgroup's output stores. With kOverlapStores they run inside the K loop, where the accumulators
    // take most registers: so besides the packed wave only the store count, the tile slot in use and a
    // pending flag are kept, and the rest (staging buffer, the thread's place, where the tile goes) is
    // derived at the store from threadIdx and the tile slot. A tile's slot stays held until its last wave
    // is stored.
    struct WaveStores {
        u8* smem;
        const OutputDescriptors* tma_d;
        u32 count;     // stores issued so far (Store::count)
        u32 use;       // the current tile's slot use (kOverlapStores)
        bool pending;  // `packed` holds the last wave of the previous tile (slot use - 1, still held)
        u32 packed[kOverlapStores ? kBlockN / 4 : 1];  // a wave's BF16 pairs, waiting for its store

        DG_DEVICE static constexpr u32 wave_offset(u32 wave) { return wave * kNumMathWarpgroups * 64; }

        DG_DEVICE static void zero(float (&values)[kBlockN / 2]) {
#pragma unroll
            for (u32 i = 0; i < kBlockN / 2; ++i) {
                values[i] = 0.0f;
            }
        }

        DG_DEVICE Store staging() const {
            return Store{smem + kOffsetD + (threadIdx.x / 128 - 1) * kDBytesPerWarpgroup, count};
        }

        // Every output store of a computed tile goes through put or put_packed (one TMA bulk group each).
        DG_DEVICE void put(const float (&values)[kStoreN / 2], u32 to_col, u32 to_row) {
            Store store = staging();
            store.store(values, tma_d, to_col, to_row, threadIdx.x % 128, threadIdx.x / 128);
            count = store.count;
        }

        // `packed` as wave `wave` of the tile in slot use `tile_use`.
        DG_DEVICE void put_packed(u32 tile_use, u32 wave) {
            if constexpr (kOverlapStores) {
                const GroupedTile& tile = TileSlots{smem}.slot(tile_use)->tile;
                const u32 first_row = wave_row(0, threadIdx.x / 128 - 1);
                Store store = staging();
                store.store_bf16(packed, tma_d, tile.n_block * kBlockN,
                                 tile.row_begin + tile.m_block * kBlockM + first_row + wave_offset(wave), threadIdx.x % 128,
                                 threadIdx.x / 128);
                count = store.count;
            }
        }

        DG_DEVICE void pack(const float (&values)[kBlockN / 2]) {
            if constexpr (kOverlapStores) {
                Store::pack_bf16(values, packed);
            }
        }

        // Store the previous tile's pending wave and let the loader have that tile's slot.
        DG_DEVICE void flush() {
            if (pending) {
                put_packed(use - 1, kNumWaves - 1);
                release_slot(TileSlots{smem}, use - 1);
                pending = false;
            }
        }
    };

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

    // One tile's K loop: MMAs into FP32 partials, promoted into `results` with their scales every K block.
    // kStraddleCol: the tile's scale-block switch column when known at compile time, 0 for a run-time select;
    // kTileN: the tile's columns (block_n, or kLastBlockN for a narrow last N-block).
    template <u32 kStraddleCol, u32 kTileN = kBlockN>
    DG_DEVICE static void k_loop(const Ring& ring, u32& stage, u32& phase, const TileLoop& t, const Promotion& promotion,
                                 float (&results)[kNumWaves][kBlockN / 2], WaveStores& stores) {
        float (&result)[kBlockN / 2] = results[0];
        if constexpr (!kPipelinedPromotion) {
            // One accumulator: per wave issue, wait, promote; the stage is released after the last
            // wave's MMAs. Two math warpgroups overlap each other's promotion with their MMAs. Everything
            // the promotion needs besides the accumulator (sfb, sfa, their products) is read before the
            // wait, so the wait -> FFMA -> next issue chain is as short as it can be.
            float partial[kTileN / 2];
            // first / last: the tile's first / last K block (constants at each call). With kOverlapStores the
            // first block stores the previous tile's pending wave after its first MMAs and sets the results;
            // the last block packs each wave but the last and stores it after the next wave's MMAs; both are
            // compiled apart from the loop, which keeps its registers for the accumulators.
            const auto k_block_step = [&](u32 k_block, bool first, bool last) {
                const ScaleB scale_b = promotion.scale_b(k_block);
                ptx::mbarrier_wait(&ring.full[stage], phase);
#pragma unroll
                for (u32 w = 0; w < kNumWaves; ++w) {
                    // Waves past the tile's rows (block_m 256 tail tiles, and contiguous half tiles)
                    // issue nothing; TMA zero-filled any rows past M.
                    if (w > 0 && t.row_in_tensor + (wave_row(w, t.math_wg) - t.first_row) >= t.rows) {
                        break;
                    }
                    ScaleA scale_a;
                    issue_block<kTileN>(ring, stage, wave_row(w, t.math_wg), t.row_in_wg, partial, scale_a);
                    if constexpr (kOverlapStores) {
                        if (first && w == 0) {
                            stores.flush();
                        }
                        if (last && w > 0) {
                            stores.put_packed(stores.use, w - 1);
                        }
                    }
                    const BlockScales scales = Promotion::combine(scale_a, scale_b);
                    ptx::wgmma_wait_group<0>();
                    ptx::fence_accumulators(partial);
                    const bool last_wave =
                        w + 1 == kNumWaves || t.row_in_tensor + (wave_row(w + 1, t.math_wg) - t.first_row) >= t.rows;
                    if (last_wave) {
                        release_stage(ring, stage, t.lane);  // every MMA reading the stage is done
                    }
                    if (kOverlapStores && first) {
                        promotion.template apply<kStraddleCol, kTileN, true>(results[w], partial, scales);
                    } else {
                        promotion.template apply<kStraddleCol, kTileN, false>(results[w], partial, scales);
                    }
                    if (kOverlapStores && last && w + 1 < kNumWaves) {
                        stores.pack(results[w]);  // final: stored after the next wave's MMAs are issued
                    }
                }
                Ring::advance(stage, phase);
            };
            if constexpr (kOverlapStores) {
                // Whole tiles: t.k_begin = 0 and t.k_end = kNumKBlocks.
                if constexpr (kNumKBlocks == 1) {
                    k_block_step(0, true, true);
                } else {
                    k_block_step(0, true, false);
                    for (u32 k_block = 1; k_block + 1 < kNumKBlocks; ++k_block) {
                        k_block_step(k_block, false, false);
                    }
                    k_block_step(kNumKBlocks - 1, false, true);
                }
            } else {
                for (u32 k_block = t.k_begin; k_block < t.k_end; ++k_block) {
                    k_block_step(k_block, false, false);
                }
            }
        } else {
            // Two accumulators: block k+1's MMAs run while block k is promoted, so the tensor cores
            // stay busy even when every warpgroup promotes at the same time.
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
            for (; k_block + 2 < t.k_end; k_block += 2) {
                retire(partial0);
                issue(partial1, scales1);
                promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);
                retire(partial1);
                issue(partial0, scales0);
                promotion.template apply<kStraddleCol, kTileN>(result, partial1, scales1);
            }
            retire(partial0);
            if ((t.k_end - t.k_begin) % 2 == 0) {
                issue(partial1, scales1);
                promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);
                retire(partial1);
                promotion.template apply<kStraddleCol, kTileN>(result, partial1, scales1);
            } else {
                promotion.template apply<kStraddleCol, kTileN>(result, partial0, scales0);
            }
        }
    }

    // k_loop compiled once per possible switch column of straddling tiles when there are at most four
    // (kStaticStraddle), so each column's scale is chosen at compile time; otherwise with a run-time select.
    template <u32 kCol = kStraddleStep>
    DG_DEVICE static void k_loop_for(u32 straddle_col, const Ring& ring, u32& stage, u32& phase, const TileLoop& t,
                                     const Promotion& promotion, float (&results)[kNumWaves][kBlockN / 2],
                                     WaveStores& stores) {
        if constexpr (!kMayStraddle) {
            k_loop<kScaleBlock>(ring, stage, phase, t, promotion, results, stores);
        } else if constexpr (!kStaticStraddle) {
            k_loop<0>(ring, stage, phase, t, promotion, results, stores);
        } else if constexpr (kCol < kScaleBlock) {
            if (straddle_col == kCol) {
                k_loop<kCol>(ring, stage, phase, t, promotion, results, stores);
            } else {
                k_loop_for<kCol + kStraddleStep>(straddle_col, ring, stage, phase, t, promotion, results, stores);
            }
        } else {
            k_loop<kScaleBlock>(ring, stage, phase, t, promotion, results, stores);
        }
    }

    // A math warpgroup's FP32 partial in a split unit's workspace slot: 16-byte vectors, thread-major within
    // each group of four registers, so a warp moves 512 contiguous bytes per instruction. (Scalar stores
    // with a fence in every thread took 3.3-4.2 us per 128 KB partial, about four K blocks of a 256 x 128
    // tile; vectors with one release after the warpgroup's barrier, 1.9-3.3 us.)
    static constexpr u32 kWarpgroupPartialFloats = kNumWaves * (kBlockN / 2) * 128;
    static constexpr u32 kSlotFloats = kNumMathWarpgroups * kWarpgroupPartialFloats;

    DG_DEVICE static float* partial_at(const GemmProblem& problem, u32 slot, u32 math_wg, u32 thread_in_wg) {
        return problem.workspace + slot * kSlotFloats + math_wg * kWarpgroupPartialFloats + thread_in_wg * 4;
    }

    DG_DEVICE static void write_partial(float* partial, const float (&results)[kNumWaves][kBlockN / 2]) {
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
#pragma unroll
            for (u32 q = 0; q < kBlockN / 8; ++q) {
                const float* r = &results[w][q * 4];
                ptx::st_global_v4(partial + (w * (kBlockN / 8) + q) * 512, r[0], r[1], r[2], r[3]);
            }
        }
    }

    DG_DEVICE static void add_partial(const float* partial, float (&results)[kNumWaves][kBlockN / 2]) {
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
#pragma unroll
            for (u32 q = 0; q < kBlockN / 8; ++q) {
                const float4 v = ptx::ld_global_cg_v4(partial + (w * (kBlockN / 8) + q) * 512);
                results[w][q * 4] += v.x;
                results[w][q * 4 + 1] += v.y;
                results[w][q * 4 + 2] += v.z;
                results[w][q * 4 + 3] += v.w;
            }
        }
    }

    // Split tail: publish this K range's FP32 results (scaled partial sums) in its workspace slot; the
    // last of the tile's ranges to arrive sums all of them in range order (the same result whichever
    // CTA is last), returns true and stores the tile; the others return false. Per math warpgroup,
    // with a counter that the last arrival resets for the next launch.
    DG_DEVICE static bool reduce_split(const GemmProblem& problem, const SplitUnit& unit, u32 math_wg, u32 thread_in_wg,
                                       u32 barrier_id, u32* flag, float (&results)[kNumWaves][kBlockN / 2]) {
        write_partial(partial_at(problem, unit.slot, math_wg, thread_in_wg), results);
        ptx::named_barrier_sync(barrier_id, 128);  // also: every thread has read the previous tile's `flag`
        if (thread_in_wg == 0) {
            u32* counter = problem.counters + unit.tail_tile * kNumMathWarpgroups + math_wg;
            // Release this warpgroup's partial; the last arrival acquires everyone's.
            const bool last = ptx::atom_add_acq_rel_gpu(counter, 1u) + 1 == unit.splits;
            if (last) {
                *counter = 0u;  // every range of this tile has arrived
            }
            *flag = last ? 1u : 0u;
        }
        ptx::named_barrier_sync(barrier_id, 128);
        if (*flag == 0) {
            return false;
        }
        // K ranges in order (a fixed summation order: the result does not depend on arrival order).
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
#pragma unroll
            for (u32 i = 0; i < kBlockN / 2; ++i) {
                results[w][i] = 0.0f;
            }
        }
        const u32 first = unit.slot - unit.slot % unit.splits;
        for (u32 r = 0; r < unit.splits; ++r) {
            add_partial(partial_at(problem, first + r, math_wg, thread_in_wg), results);
        }
        return true;
    }

    // Stream tail: a tile's end (k_begin > 0) leaves its partial in the tile's workspace slot and counts
    // itself in; the tile's head (k_begin = 0, its CTA's last unit) waits for the splits - 1 other pieces and
    // adds their partials. Returns whether to store. Ends never wait and run on CTAs of lower index than the
    // heads (StreamTailTileScheduler), so the wait ends as long as CTAs are dispatched in index order.
    DG_DEVICE static bool reduce_stream(const GemmProblem& problem, const SplitUnit& unit, u32 math_wg, u32 thread_in_wg,
                                        u32 barrier_id, float (&results)[kNumWaves][kBlockN / 2]) {
        u32* counter = problem.counters + unit.tail_tile * kNumMathWarpgroups + math_wg;
        float* partial = partial_at(problem, unit.slot, math_wg, thread_in_wg);
        if (unit.k_begin != 0) {
            write_partial(partial, results);
            ptx::named_barrier_sync(barrier_id, 128);
            if (thread_in_wg == 0) {
                ptx::red_add_release_gpu(counter, 1u);
            }
            return false;
        }
        if (thread_in_wg == 0) {
            while (ptx::ld_acquire_gpu(counter) != unit.splits - 1) {
                __nanosleep(64);
            }
            *counter = 0;  // no other piece of this tile arrives in this launch
        }
        ptx::named_barrier_sync(barrier_id, 128);
        add_partial(partial, results);
        return true;
    }

    // Contiguous layout: a block of padding rows stores zeros and reads nothing.
    DG_DEVICE static void store_padding_block(Store& store, const OutputDescriptors* tma_d, const GroupedTile& tile,
                                              u32 math_wg, u32 thread_in_wg, u32 barrier_id) {
        const u32 first_row = wave_row(0, math_wg);
        const u32 row_in_tensor = tile.m_block * kBlockM + first_row;
        float zeros[kStoreN / 2];
#pragma unroll
        for (u32 i = 0; i < kStoreN / 2; ++i) {
            zeros[i] = 0.0f;
        }
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            const u32 wave_offset = wave_row(w, math_wg) - first_row;
            if (row_in_tensor + wave_offset >= tile.rows) {
                break;
            }
#pragma unroll
            for (u32 c = 0; c < kStoreChunks; ++c) {
                store.store(zeros, tma_d, tile.n_block * kBlockN + c * kStoreN, tile.row_begin + row_in_tensor + wave_offset,
                            thread_in_wg, barrier_id);
            }
        }
    }

    // What a math thread keeps for the whole kernel.
    struct MathThread {
        u32 math_wg;
        u32 thread_in_wg;
        u32 lane;
        u32 row_in_wg;  // and row_in_wg + 8
        u32 barrier_id;
        u32 first_row;  // this warpgroup's first row within the tile
    };

    // One tile of one math warpgroup: K loop and epilogue. `tile`, `unit` and `sfb_tile` live in the tile
    // slot (tile loader; released as soon as the epilogue has read what it needs) or in this thread's
    // registers and the warpgroup's staged sfb (own schedule). `results` is the warpgroup's accumulator,
    // zeroed here (with kOverlapStores the first K block sets it instead).
    DG_DEVICE static void run_tile(const Ring& ring, u32& stage, u32& phase, WaveStores& stores, float (&results)[kNumWaves][kBlockN / 2],
                                   const GemmProblem& problem, const MathThread& me, const GroupedTile& tile,
                                   const SplitUnit& unit, const float* sfb_tile, const TileSlots& slots, u32 use) {
        if constexpr (kOverlapStores) {
            stores.use = use;
        }
        if (tile.padding) {
            if constexpr (kOverlapStores) {
                stores.flush();
            }
            Store store{stores.smem + kOffsetD + me.math_wg * kDBytesPerWarpgroup, stores.count};
            store_padding_block(store, stores.tma_d, tile, me.math_wg, me.thread_in_wg, me.barrier_id);
            stores.count = store.count;
            if constexpr (kTileLoader) {
                release_slot(slots, use);
            }
            return;
        }
        // Only what the K loop needs is read here; the epilogue reads `tile` again (with the loader the
        // K loop's barriers make the compiler reload it from the slot, so none of it stays in registers).
        const u32 k_begin = kSplitTail ? unit.k_begin : 0u;
        const u32 k_end = kSplitTail ? unit.k_end : kNumKBlocks;
        const u32 row_in_tensor = tile.m_block * kBlockM + me.first_row;  // within the group's rows
        if (row_in_tensor >= tile.rows) {
            // All 64 rows of this warpgroup are past M: keep the ring moving, compute nothing.
            if constexpr (kOverlapStores) {
                stores.flush();
            }
            for (u32 k_block = k_begin; k_block < k_end; ++k_block) {
                ptx::mbarrier_wait(&ring.full[stage], phase);
                release_stage(ring, stage, me.lane);
                Ring::advance(stage, phase);
            }
            if constexpr (kTileLoader) {
                release_slot(slots, use);
            }
            return;
        }

        const u32 straddle_col = kScaleBlock - tile.n_block * kBlockN % kScaleBlock;
        if constexpr (!kOverlapStores) {
#pragma unroll
            for (u32 w = 0; w < kNumWaves; ++w) {
                WaveStores::zero(results[w]);
            }
        }
        const Promotion promotion{sfb_tile, straddle_col};
        const TileLoop loop{k_begin, k_end, tile.rows, row_in_tensor, me.first_row, me.math_wg, me.row_in_wg, me.lane};
        if constexpr (kNarrowLast) {
            if (tile.n_block == kNumNBlocks - 1) {
                // The last block's switch column is a compile-time constant (0 as kStraddleCol means "run time":
                // it is never 0 here, the switch column is in [gcd(block_n, 128), 128]).
                constexpr u32 kLastStraddleCol = kScaleBlock - (kNumNBlocks - 1) * kBlockN % kScaleBlock;
                k_loop<kLastStraddleCol, kLastBlockN>(ring, stage, phase, loop, promotion, results, stores);
            } else {
                k_loop_for(straddle_col, ring, stage, phase, loop, promotion, results, stores);
            }
        } else {
            k_loop_for(straddle_col, ring, stage, phase, loop, promotion, results, stores);
        }

        const u32 rows = tile.rows;
        const u32 tile_row = tile.m_block * kBlockM + me.first_row;  // = row_in_tensor, read again
        if constexpr (kOverlapStores) {
            // The K loop stored every wave but the last that has rows: that one waits for the next tile's
            // first MMAs (and holds this tile's slot), unless it is wave 0 of two (the tile's rows end
            // before wave 1).
            if (kNumWaves > 1 && tile_row + WaveStores::wave_offset(kNumWaves - 1) >= rows) {
                stores.put_packed(use, 0);  // packed by the last K block
                release_slot(slots, use);
            } else {
                stores.pack(results[kNumWaves - 1]);
                stores.pending = true;
            }
            return;
        }
        const u32 row0 = tile.row_begin + tile_row;  // in the flattened output
        const u32 col0 = tile.n_block * kBlockN;
        if constexpr (kKind == GemmKind::kGroupedContiguous || kKind == GemmKind::kGroupedContiguousPsum) {
            // Padding rows inside a computed block (m_indices == -1, or any index outside [0, G);
            // psum form: rows past the group's end) are stored as zeros.
            const u32 valid_end = tile.valid_end;
#pragma unroll
            for (u32 w = 0; w < kNumWaves; ++w) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 row = row0 + (wave_row(w, me.math_wg) - me.first_row) + me.row_in_wg + half * 8;
                    bool padding_row;
                    if constexpr (kKind == GemmKind::kGroupedContiguous) {
                        padding_row = row < problem.m &&
                                      static_cast<u32>(__ldg(problem.grouping + row)) >= problem.num_groups;
                    } else {
                        padding_row = row >= valid_end;
                    }
                    if (padding_row) {
#pragma unroll
                        for (u32 j = 0; j < kBlockN / 8; ++j) {
                            results[w][j * 4 + half * 2] = 0.0f;
                            results[w][j * 4 + half * 2 + 1] = 0.0f;
                        }
                    }
                }
            }
        }
        if constexpr (kSplitTail) {
            const SplitUnit split = unit;
            if (split.splits > 1) {
                bool stores_tile;
                if constexpr (kTail == TailMode::kSplit) {
                    u32* flag = reinterpret_cast<u32*>(ring.smem + kOffsetFlags) + me.math_wg;
                    stores_tile = reduce_split(problem, split, me.math_wg, me.thread_in_wg, me.barrier_id, flag, results);
                } else {
                    stores_tile = reduce_stream(problem, split, me.math_wg, me.thread_in_wg, me.barrier_id, results);
                }
                if (!stores_tile) {
                    if constexpr (kTileLoader) {
                        release_slot(slots, use);
                    }
                    return;  // another K range of this tile stores it
                }
            }
        }
        if constexpr (kTileLoader) {
            release_slot(slots, use);
        }
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            const u32 wave_offset = wave_row(w, me.math_wg) - me.first_row;
            if (w > 0 && tile_row + wave_offset >= rows) {
                break;
            }
#pragma unroll
            for (u32 c = 0; c < kStoreChunks; ++c) {
                const auto& chunk = *reinterpret_cast<const float(*)[kStoreN / 2]>(&results[w][c * kStoreN / 2]);
                stores.put(chunk, col0 + c * kStoreN, row0 + wave_offset);
            }
        }
    }

    DG_DEVICE static void consumer(const Ring& ring, const TileSlots& slots, const OutputDescriptors* tma_d, const float* sfb,
                                   const GemmProblem& problem, u32 cta_rank) {
        MathThread me;
        me.math_wg = threadIdx.x / 128 - 1;
        me.thread_in_wg = threadIdx.x % 128;
        me.lane = me.thread_in_wg % 32;
        me.row_in_wg = (me.thread_in_wg / 32) * 16 + me.lane / 4;
        me.barrier_id = 1 + me.math_wg;
        me.first_row = wave_row(0, me.math_wg);
        WaveStores stores{ring.smem, tma_d, 0, 0, false, {}};
        float results[kNumWaves][kBlockN / 2];
#pragma unroll
        for (u32 w = 0; w < kNumWaves; ++w) {
            WaveStores::zero(results[w]);  // (kOverlapStores needs no zeros; kept: the measured build has them)
        }
        u32 stage = 0;
        u32 phase = 0;
        if constexpr (kTileLoader) {
            for (u32 use = 0;; ++use) {
                ptx::mbarrier_wait(slots.full(use), TileSlots::parity(use));
                const TileSlot& slot = *slots.slot(use);
                if (slot.done != 0) {
                    stores.use = use;  // so the final flush stores (and releases) the last tile, use - 1
                    break;
                }
                run_tile(ring, stage, phase, stores, results, problem, me, slot.tile, slot.unit, slot.sfb, slots, use);
            }
            if constexpr (kOverlapStores) {
                stores.flush();  // the last tile's last wave
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
                        sfb_tile[i] = __ldg(tile_sfb_source(sfb, tile, i));
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
        const TileSlots tile_slots{smem};

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
            ring.init(kClusterM * kNumMathThreads / 32);  // (its fence also covers the tile-slot barriers)
        }
        const u32 cta_rank = kClusterM == 1 ? 0 : ptx::cluster_cta_rank();
        if constexpr (kClusterM == 1) {
            __syncthreads();
        } else {
            ptx::cluster_sync();  // both CTAs' barriers exist before any multicast or remote arrive
        }

        if (threadIdx.x < 128) {
            ptx::setmaxnreg_dec<kProducerRegisters>();
            if (threadIdx.x == 0) {
                producer(ring, tma_a, tma_b, tma_sfa, tma_a_last, tma_sfa_last, tma_b_last, problem, cta_rank);
            } else if (kTileLoader && threadIdx.x / 32 == 1) {
                tile_loader(tile_slots, sfb, problem, cta_rank, threadIdx.x % 32);
            }
        } else {
            ptx::setmaxnreg_inc<kMathRegisters>();
            consumer(ring, tile_slots, tma_d, sfb, problem, cta_rank);
        }
        if constexpr (kClusterM > 1) {
            // The peer may still arrive on this CTA's barriers: neither CTA leaves before both are done.
            __syncwarp();
            ptx::cluster_sync();
        }
    }
};

}  // namespace deepgemm
