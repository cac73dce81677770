// The tile sequence of each GEMM kind, as GroupedTile records, over the schedulers of persistent_tiles.cuh
// and grouped_tiles.cuh. The producer, the tile loader and (without a loader) the math warpgroups each own
// a copy and see the same sequence.
#pragma once
#include <deepgemm/ptx/types.cuh>
#include <deepgemm/scheduler/grouped_tiles.cuh>
#include <deepgemm/scheduler/persistent_tiles.cuh>

namespace deepgemm {

// Which rows of A/D and which B a tile uses (B is [G, N, K] for the M-grouped kinds). kKGrouped (the BF16
// kernel's; its tiles come from kgrouped_tiles.cuh, not a TileSource): a K range per group, D [G, M, N].
enum class GemmKind : int { kDense = 0, kGroupedContiguous = 1, kGroupedMasked = 2, kGroupedContiguousPsum = 3, kKGrouped = 4 };

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

// One tile sequence per kind (dense: group 0, no padding, kClusterM x kClusterN CTAs per cluster; grouped kinds
// run 1 x 1). kRotateWaves: the contiguous walk's rotation (ContiguousBlockWalk), for kernels whose last N-block
// is narrow; the other kinds ignore it.
template <GemmKind kKind, u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, u32 kClusterN, bool kRotateWaves>
struct TileSource;

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, u32 kClusterN, bool kRotateWaves>
struct TileSource<GemmKind::kDense, kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN, kRotateWaves> {
    PersistentTileScheduler<kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN> scheduler;
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

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, u32 kClusterN, bool kRotateWaves>
struct TileSource<GemmKind::kGroupedContiguous, kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN, kRotateWaves> {
    ContiguousTileScheduler<kBlockM, kNumNBlocks, kRotateWaves, kGroupM> scheduler;

    DG_DEVICE TileSource(const GemmProblem& p, u32) : scheduler(p.grouping, p.m, p.num_groups) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit&) { return scheduler.next(tile); }
};

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, u32 kClusterN, bool kRotateWaves>
struct TileSource<GemmKind::kGroupedContiguousPsum, kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN, kRotateWaves> {
    ContiguousPsumTileScheduler<kBlockM, kNumNBlocks, kRotateWaves> scheduler;

    DG_DEVICE TileSource(const GemmProblem& p, u32) : scheduler(p.grouping, p.m, p.num_groups) {}

    DG_DEVICE bool next(GroupedTile& tile, SplitUnit&) { return scheduler.next(tile); }
};

template <u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, u32 kClusterN, bool kRotateWaves>
struct TileSource<GemmKind::kGroupedMasked, kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN, kRotateWaves> {
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

// The tile source of a GEMM: its kind's sequence for whole tiles, the split or stream tail's otherwise.
template <GemmKind kKind, TailMode kTail, u32 kBlockM, u32 kNumNBlocks, u32 kGroupM, u32 kClusterM, u32 kClusterN,
          u32 kNumKBlocks, bool kRotateWaves>
struct GemmTileSource {
    using TailScheduler = typename SelectType<kTail == TailMode::kStream, StreamTailTileScheduler<kBlockM, kNumNBlocks, kGroupM, kNumKBlocks>,
                                              SplitTailTileScheduler<kBlockM, kNumNBlocks, kGroupM, kNumKBlocks>>::Type;
    using Type = typename SelectType<kTail != TailMode::kWhole, SplitTailTileSource<TailScheduler>,
                                     TileSource<kKind, kBlockM, kNumNBlocks, kGroupM, kClusterM, kClusterN, kRotateWaves>>::Type;
};

}  // namespace deepgemm
