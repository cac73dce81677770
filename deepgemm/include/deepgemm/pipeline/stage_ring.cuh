// The multi-stage ring between a TMA producer and the math warpgroups: kNumStages shared-memory stages,
// each with a "full" barrier (one producer arrive plus the TMA transaction bytes) and an "empty" barrier
// (one arrive per consuming warp). Producer and consumers walk it with their own (stage, phase) cursor.
#pragma once
#include <deepgemm/ptx/mbarrier.cuh>
#include <deepgemm/ptx/sync.cuh>

namespace deepgemm {

// The thread that issues a kernel's TMA loads, called by the first warpgroup (converged warps). kElected: an
// elected lane of warp 0, so ptxas knows one thread runs the producer and issues each load as a single UTMALDG.
// For `threadIdx.x == 0` it wraps every load in a loop over the active lanes: ~320 instead of ~210 cycles per
// stage in clock64 traces (H100), which holds back narrow one-warpgroup tiles, whose MMAs take less.
template <bool kElected>
DG_DEVICE bool is_producer_thread() {
    if constexpr (kElected) {
        return threadIdx.x / 32 == 0 && ptx::elect_one_lane();
    } else {
        return threadIdx.x == 0;
    }
}

template <u32 kNumStages>
struct StageRing {
    u8* smem;   // the kernel's dynamic shared memory; stages live at kernel-defined offsets
    u64* full;  // kNumStages barriers
    u64* empty;  // kNumStages barriers

    // The ring over `smem` with its 2 x kNumStages barriers at `barriers_offset` (8-byte aligned).
    DG_DEVICE static StageRing at(u8* smem, u32 barriers_offset) {
        u64* barriers = reinterpret_cast<u64*>(smem + barriers_offset);
        return StageRing{smem, barriers, barriers + kNumStages};
    }

    // One thread initialises every barrier; the caller synchronises the CTA (or cluster) afterwards.
    DG_DEVICE void init(u32 empty_arrivals) const {
#pragma unroll
        for (u32 s = 0; s < kNumStages; ++s) {
            ptx::mbarrier_init(&full[s], 1);
            ptx::mbarrier_init(&empty[s], empty_arrivals);
        }
        ptx::mbarrier_init_fence();
    }

    DG_DEVICE static void advance(u32& stage, u32& phase) {
        if (++stage == kNumStages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

}  // namespace deepgemm
