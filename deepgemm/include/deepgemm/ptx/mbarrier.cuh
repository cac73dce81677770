// mbarrier wrappers: the arrive/wait objects that pair TMA producers with wgmma consumers.
#pragma once
#include <deepgemm/ptx/sync.cuh>

namespace deepgemm::ptx {

DG_DEVICE void mbarrier_init(u64* bar, u32 arrive_count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrive_count) : "memory");
}

// Make barrier initialisation visible to the other threads and to the async proxy.
DG_DEVICE void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    fence_proxy_async_smem();
}

DG_DEVICE void mbarrier_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrive once and announce `bytes` of asynchronous (TMA) transactions that complete this phase.
DG_DEVICE void mbarrier_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

DG_DEVICE bool mbarrier_try_wait(u64* bar, u32 parity) {
    u32 done;
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

// Block until the phase with the given parity has completed.
DG_DEVICE void mbarrier_wait(u64* bar, u32 parity) {
    while (!mbarrier_try_wait(bar, parity)) {
    }
}

}  // namespace deepgemm::ptx
