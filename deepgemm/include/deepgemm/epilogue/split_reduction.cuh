// The split and stream tails' reductions (TailMode::kSplit / kStream): the K ranges of a tail tile meet in a
// workspace of FP32 partials, and one of them adds the others' and stores the tile.
//
// A math warpgroup's partial in a split unit's workspace slot is 16-byte vectors, thread-major within each
// group of four registers, so a warp moves 512 contiguous bytes per instruction, released once after the
// warpgroup's barrier (scalar stores with a fence in every thread measured much slower).
#pragma once
#include <deepgemm/ptx/sync.cuh>
#include <deepgemm/scheduler/tile_sources.cuh>

namespace deepgemm {

template <typename Cfg>
struct SplitReduction {
    static constexpr u32 kBlockN = Cfg::kBlockN;
    static constexpr u32 kNumWaves = Cfg::kNumWaves;
    static constexpr u32 kNumMathWarpgroups = Cfg::kNumMathWarpgroups;
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

    // A split unit's reduction in the kernel's tail mode: whether this unit stores its tile (a whole tile,
    // or the piece that summed the others). `flags`: the split tail's per-warpgroup shared flags.
    DG_DEVICE static bool reduce(const GemmProblem& problem, const SplitUnit& unit, u32* flags, u32 math_wg, u32 thread_in_wg,
                                 u32 barrier_id, float (&results)[kNumWaves][kBlockN / 2]) {
        const SplitUnit split = unit;
        if (split.splits > 1) {
            bool stores_tile;
            if constexpr (Cfg::kTail == TailMode::kSplit) {
                u32* flag = flags + math_wg;
                stores_tile = reduce_split(problem, split, math_wg, thread_in_wg, barrier_id, flag, results);
            } else {
                stores_tile = reduce_stream(problem, split, math_wg, thread_in_wg, barrier_id, results);
            }
            return stores_tile;
        }
        return true;
    }
};

}  // namespace deepgemm
