// The multi-stage ring between a TMA producer and the math warpgroups: kNumStages shared-memory stages,
// each with a "full" barrier (one producer arrive plus the TMA transaction bytes) and an "empty" barrier
// (one arrive per consuming warp). Producer and consumers walk it with their own (stage, phase) cursor.
#pragma once
#include <deepgemm/ptx/mbarrier.cuh>

namespace deepgemm {

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
