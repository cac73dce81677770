// Compile-time configuration of the 1D2D FP8 GEMM (impls/sm90_fp8_gemm_1d2d.cuh): tile shape, warpgroup roles,
// register split, output staging, last-block shapes and the shared-memory map. The mainloop and epilogue
// pieces are templates over this struct (`Cfg`).
#pragma once
#include <deepgemm/epilogue/store_fragment.cuh>
#include <deepgemm/pipeline/stage_ring.cuh>
#include <deepgemm/ptx/types.cuh>
#include <deepgemm/scheduler/tile_sources.cuh>

namespace deepgemm {

template <u32 kN_, u32 kK_, u32 kBlockM_, u32 kBlockN_, u32 kNumStages_, u32 kGroupM_, u32 kClusterM_, bool kPipelinedPromotion_,
          bool kOutputFp32_, GemmKind kKind_, TailMode kTail_, bool kChunkedStore_, bool kNarrowLastN_, u32 kClusterN_>
struct Sm90Fp8Gemm1D2DConfig {
    static constexpr u32 kN = kN_;
    static constexpr u32 kK = kK_;
    static constexpr u32 kBlockM = kBlockM_;
    static constexpr u32 kBlockN = kBlockN_;
    static constexpr u32 kNumStages = kNumStages_;
    static constexpr u32 kGroupM = kGroupM_;
    static constexpr u32 kClusterM = kClusterM_;
    static constexpr u32 kClusterN = kClusterN_;
    static constexpr u32 kClusterSize = kClusterM * kClusterN;  // CTAs per cluster (each stage released to all)
    static constexpr bool kPipelinedPromotion = kPipelinedPromotion_;
    static constexpr bool kOutputFp32 = kOutputFp32_;
    static constexpr GemmKind kKind = kKind_;
    static constexpr TailMode kTail = kTail_;
    static constexpr bool kChunkedStore = kChunkedStore_;
    static constexpr bool kNarrowLastN = kNarrowLastN_;

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
    static_assert(kClusterN == 1 || (kClusterN == 2 && kClusterM == 1 && kKind == GemmKind::kDense && !kSplitTail),
                  "A multicast: 2-CTA clusters along N, dense whole tiles, not with cluster_m");
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
    // tile scheduler; one math warpgroup has no loader, and 56 is more than its TMA thread needs.
    // The TMA producer is an elected lane (no per-load waterfall) in narrow one-warpgroup tiles, which are
    // producer-bound with thread 0 (64 x 16 and 64 x 32 ran 3-8% faster with it on an H100), and in every pipelined
    // build, whose K loop promotes after issuing all four MMAs and so leaves each stage sooner (the K loop's
    // promote_after_issue). Other tiles keep thread 0 (the elected lane measured level to 2% slower there: 256 x 128).
    static constexpr bool kElectedProducer = (kNumMathWarpgroups == 1 && kBlockN <= 32) || kPipelinedPromotion;
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

    // The last N-block, when N is not a multiple of block_n, holds only kLastBlockN columns (rounded up to 8,
    // the wgmma N step). Its tiles load B in a box of that many rows (a second descriptor: for grouped B the rows
    // past N would be the next expert's, real bytes) and issue wgmma of that width into an accumulator of their
    // own, whose fragment is the wide one's first kLastBlockN / 2 registers, so the promotion adds it into the
    // results' first registers. The columns past it are stored from stale registers and clipped by the output
    // descriptor at N. E.g. 128 x 192 tiles at N = 4096 spend 21 full blocks and one of 64 columns: the last is a
    // third of the work instead of a whole tile. (A separate accumulator, because narrow MMAs into a prefix of the
    // wide accumulator array make ptxas wait after every wgmma.) Contiguous layouts then rotate their walk
    // (ContiguousBlockWalk::kRotateWaves), so the cheap tiles do not all fall to the same CTAs.
    // kNarrowLastN = false compiles full-width last blocks and the plain walk.
    static constexpr u32 kLastBlockN = align_up(kN - (kNumNBlocks - 1) * kBlockN, 8u);
    static constexpr bool kNarrowLast = kNarrowLastN && kClusterSize == 1 && kLastBlockN < kBlockN;
    static constexpr u32 kLastBoxRowsB = kNarrowLast ? kLastBlockN : kBlockN;
    using Tiles = typename GemmTileSource<kKind, kTail, kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN, kNumKBlocks,
                                         kNarrowLast>::Type;
    static constexpr u32 kMulticastRowsB = kBlockN / kClusterM;
    // kClusterN = 2: both CTAs compute the same M-block; each loads half of A's rows, multicast into both.
    static constexpr u32 kMulticastRowsA = kBlockM / kClusterN;
    // Masked groups hold few valid rows at decode sizes: their A tiles are loaded in boxes of kLoadRowsA rows,
    // only as many as the tile's valid rows need (a 64-row wave reads stale shared memory in the rows past
    // them; those output rows lie past masked_m, where the result is unspecified). Other kinds load a tile in
    // one box (TMA zero-fills rows past the tensor), a dense GEMM's partial last M-block in a smaller one (below).
    static constexpr u32 kLoadRowsA = kKind == GemmKind::kGroupedMasked ? (kBlockM == 64 ? 16u : 64u) : kBlockM;
    static_assert(kBlockM % kLoadRowsA == 0, "A boxes must tile block_m");
    // A dense GEMM's last M-block, when M does not fill it, loads A and sfa through a second pair of
    // descriptors whose box is dense_last_box_rows<kBlockM> (scheduler/persistent_tiles.cuh). One box per stage
    // either way (several smaller boxes per stage measured slower).

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
    // math warpgroup (decode-sized tiles, one tile per CTA in most launches) schedules its own tiles
    // (measured faster on the H200; then slot 0 only stages its sfb).
    static constexpr bool kTileLoader = kNumMathWarpgroups > 1;
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

    // First tile row of wave `wave` of warpgroup `math_wg` (block_m 256: rows 128v + 64w).
    DG_DEVICE static constexpr u32 wave_row(u32 wave, u32 math_wg) { return (wave * kNumMathWarpgroups + math_wg) * 64; }
};

}  // namespace deepgemm
