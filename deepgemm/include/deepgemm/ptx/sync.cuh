// Shared-memory addressing, fences, named barriers, register reallocation (setmaxnreg), lane helpers and values
// opaque to the compilers (scheduling barriers).
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

// A global u32 read with acquire semantics at GPU scope (pairs with another CTA's release).
DG_DEVICE u32 ld_acquire_gpu(const u32* ptr) {
    u32 value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
    return value;
}

// Add to a global u32 with release semantics at GPU scope: the writes this thread has observed (its own,
// and through a preceding bar.sync its warpgroup's) are visible to whoever acquires the new value.
DG_DEVICE void red_add_release_gpu(u32* ptr, u32 value) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(ptr), "r"(value) : "memory");
}

// Add to a global u32 with acquire-release semantics at GPU scope; returns the old value.
DG_DEVICE u32 atom_add_acq_rel_gpu(u32* ptr, u32 value) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(ptr), "r"(value) : "memory");
    return old;
}

// 16-byte global store and L2-only (.cg) load.
DG_DEVICE void st_global_v4(float* ptr, float a, float b, float c, float d) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

DG_DEVICE float4 ld_global_cg_v4(const float* ptr) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(ptr) : "memory");
    return v;
}

// Programmatic dependent launch. A kernel launched with the programmatic-stream-serialization attribute may
// start before the previous kernel in its stream has finished: grid_dependency_wait blocks until every grid this
// one depends on has completed and its writes are visible (at once when there is none, e.g. a plain launch).
// Every kernel of ours calls it before its first global-memory access. The GEMMs let their dependents launch
// once each CTA's producer has issued its last TMA load, so a dependent launches only in the grid's tail (from then
// on it may take any free SM, and wait there); the quantizers, short and not persistent, right after the wait.
DG_DEVICE void grid_dependency_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Lets the grids that depend on this one launch once every CTA of this grid has called it (any one thread) or
// exited; their own grid_dependency_wait still holds them until this grid completes. No effect on a plain launch.
DG_DEVICE void launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// The quantizers' first step: wait for the grids they depend on, then let their dependents launch.
DG_DEVICE void programmatic_launch_sync() {
    grid_dependency_wait();
    launch_dependents();
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

// A run-time non-zero value (the launch's dynamic shared-memory size) that neither NVVM nor ptxas can fold: a branch
// on it ends a basic block, and ptxas does not move instructions across it. `opaque` hides a value from NVVM again
// (no instruction), so a branch on it is not hoisted out of a loop.
DG_DEVICE u32 opaque_nonzero() {
    u32 value;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(value));
    return value;
}

DG_DEVICE void opaque(u32& value) {
    asm volatile("" : "+r"(value));
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

// Store four (x4) or two (x2) 8x8 matrices of 16-bit elements to shared memory. Register i of lane l holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (the wgmma accumulator's fragment layout);
// lane l gives the 16-byte address of row l % 8 of matrix l / 8 (x2: lanes 0-15).
DG_DEVICE void stmatrix_x4(void* smem_row, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(smem_row)), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

DG_DEVICE void stmatrix_x2(void* smem_row, u32 r0, u32 r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};" ::"r"(smem_addr(smem_row)), "r"(r0), "r"(r1) : "memory");
}

}  // namespace deepgemm::ptx
