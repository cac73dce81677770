// The 1D2D GEMM's tile slots and tile loader. With two or three math warpgroups, the producer warpgroup's
// second warp runs their tile schedule and publishes each tile, with its sfb (one or two rows of ceil(K/128)
// floats), in one of two shared slots a tile ahead: a tile start never waits on a global load. (One math
// warpgroup schedules its own tiles and stages its sfb in slot 0.)
#pragma once
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/scheduler/tile_sources.cuh>

namespace deepgemm {

// One tile as the loader warp publishes it: what the scheduler returned, and its sfb rows.
template <typename Cfg>
struct TileSlot {
    GroupedTile tile;
    SplitUnit unit;
    u32 done;  // 1: the schedule is exhausted (the slot holds no tile)
    u32 reserved[16 - (sizeof(GroupedTile) + sizeof(SplitUnit)) / 4 - 1];
    float sfb[Cfg::kSfbSlotFloats];  // kScaleRowsPerTile rows of ceil(K/128) scales
    static_assert(sizeof(GroupedTile) + sizeof(SplitUnit) + 4 <= 64, "the tile header fits 64 bytes");
};

// Two tile slots and their barriers: "full" completes when the loader warp's 32 lanes have written a
// tile, "empty" when every math thread is done with it. Use u (u = 0, 1, ...) is slot u % 2 with phase
// parity (u / 2) % 2; addresses are formed from the shared-memory base on use, so the math warpgroups
// keep only the use counter live through their K loops.
template <typename Cfg>
struct TileSlots {
    static constexpr u32 kTileSlots = Cfg::kTileSlots;
    static_assert(sizeof(TileSlot<Cfg>) <= Cfg::kTileSlotBytes, "tile slot layout");

    u8* smem;

    DG_DEVICE u64* full(u32 use) const { return reinterpret_cast<u64*>(smem + Cfg::kOffsetSlotBarriers) + use % kTileSlots; }
    DG_DEVICE u64* empty(u32 use) const {
        return reinterpret_cast<u64*>(smem + Cfg::kOffsetSlotBarriers) + kTileSlots + use % kTileSlots;
    }
    DG_DEVICE TileSlot<Cfg>* slot(u32 use) const {
        return reinterpret_cast<TileSlot<Cfg>*>(smem + Cfg::kOffsetTileSlots + use % kTileSlots * Cfg::kTileSlotBytes);
    }
    DG_DEVICE static u32 parity(u32 use) { return (use / kTileSlots) & 1; }

    DG_DEVICE void init() const {
#pragma unroll
        for (u32 s = 0; s < kTileSlots; ++s) {
            ptx::mbarrier_init(full(s), 32);
            ptx::mbarrier_init(empty(s), Cfg::kNumMathThreads);
        }
    }

    // This thread is done with the tile in slot use `use` (every math thread arrives, once per tile: with one
    // elected lane per warp after __syncwarp, compute-sanitizer racecheck does not see the other lanes' reads of
    // the slot ordered before the loader's next write and reports WAR hazards; per-thread arrivals are clean).
    DG_DEVICE void release(u32 use) const {
        ptx::mbarrier_arrive(empty(use));
    }
};

template <typename Cfg>
struct Sm90Fp8TileLoader1D2D : Cfg {
    using typename Cfg::Tiles;
    using Cfg::kBlockN;
    using Cfg::kNumKBlocks;
    using Cfg::kNumScaleRowsB;
    using Cfg::kScaleBlock;
    using Cfg::kSfbSlotFloats;

    // Where scale i of a tile's staged sfb comes from: row i / ceil(K/128) of the tile's one or two
    // 128-column scale blocks (the second clamped to the last row at the matrix's edge), so the address is
    // always inside the group's sfb.
    DG_DEVICE static const float* tile_sfb_source(const float* sfb, const GroupedTile& tile, u32 i) {
        const u32 row = min(tile.n_block * kBlockN / kScaleBlock + i / kNumKBlocks, kNumScaleRowsB - 1);
        return sfb + (tile.group * kNumScaleRowsB + row) * kNumKBlocks + i % kNumKBlocks;
    }

    // The loader warp publishes each tile (padding blocks too) with its sfb rows (the tile's 128-column scale
    // block and, for straddling tiles, the next) a tile ahead, then a final slot marked done. The math
    // warpgroups thus never wait on the scheduler's global reads (m_indices, masked_m) or the scales' at a
    // tile start, and hold no scheduler state through their K loops.
    DG_DEVICE static void run(const TileSlots<Cfg>& slots, const float* sfb, const GemmProblem& problem, u32 cta_rank, u32 lane) {
        Tiles tiles(problem, cta_rank);
        GroupedTile tile;
        SplitUnit unit{0, kNumKBlocks, 1, 0, 0};
        for (u32 use = 0;; ++use) {
            const bool more = tiles.next(tile, unit);
            ptx::mbarrier_wait(slots.empty(use), TileSlots<Cfg>::parity(use) ^ 1);
            TileSlot<Cfg>* slot = slots.slot(use);
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
};

}  // namespace deepgemm
