// Shared-memory addressing, fences, named barriers and register reallocation (setmaxnreg).
#pragma once
#include <deepgemm/ptx/types.cuh>

namespace deepgemm::ptx {

DG_DEVICE u32 smem_addr(const void* ptr) {
    return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

// Make this thread's generic-proxy shared-memory writes visible to the async proxy (TMA, wgmma).
DG_DEVICE void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Synchronise `num_threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is __syncthreads).
DG_DEVICE void named_barrier_sync(u32 id, u32 num_threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

template <u32 kRegisters>
DG_DEVICE void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <u32 kRegisters>
DG_DEVICE void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// True in exactly one active lane of the (converged) warp: picks the lane without a lane-index register.
DG_DEVICE bool elect_one_lane() {
    u32 elected;
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  elect.sync _|p, 0xffffffff;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(elected));
    return elected != 0;
}

DG_DEVICE u32 lane_index() {
    u32 lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

// Two FP32 values rounded to nearest-even into packed BF16 (lo in the low half).
DG_DEVICE u32 pack_bf16x2(float lo, float hi) {
    u32 packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Two FP32 values rounded to nearest-even, saturated to +-448, into packed e4m3 (lo in the low byte).
DG_DEVICE u16 pack_e4m3x2(float lo, float hi) {
    u16 packed;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
    return packed;
}

}  // namespace deepgemm::ptx
