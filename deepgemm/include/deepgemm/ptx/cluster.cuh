// Thread-block-cluster primitives: rank, cluster-wide barrier, remote shared-memory load, remote mbarrier arrive,
// TMA multicast.
#pragma once
#include <deepgemm/ptx/sync.cuh>

namespace deepgemm::ptx {

DG_DEVICE u32 cluster_cta_rank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// Every thread of every CTA in the cluster arrives, then waits (release/acquire for shared memory).
DG_DEVICE void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// A float at the same shared-memory offset as `ptr` in cluster CTA `cta_rank` (distributed shared memory).
DG_DEVICE float ld_shared_cluster(const float* ptr, u32 cta_rank) {
    float value;
    asm volatile(
        "{\n"
        "  .reg .b32 remote;\n"
        "  mapa.shared::cluster.u32 remote, %1, %2;\n"
        "  ld.shared::cluster.f32 %0, [remote];\n"
        "}\n"
        : "=f"(value)
        : "r"(smem_addr(ptr)), "r"(cta_rank)
        : "memory");
    return value;
}

// Arrive on the mbarrier at the same shared-memory offset in cluster CTA `cta_rank` (may be this CTA).
// Plain arrive (no .release.cluster): an explicit cluster-scope release costs a memory fence per call,
// and the stage's readers (wgmma) have already completed through wgmma.wait_group.
DG_DEVICE void mbarrier_arrive_cluster(u64* bar, u32 cta_rank) {
    asm volatile(
        "{\n"
        "  .reg .b32 remote;\n"
        "  mapa.shared::cluster.u32 remote, %0, %1;\n"
        "  mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(cta_rank)
        : "memory");
}

// Load the box at (inner, outer) into `smem_dst` of every CTA in `cta_mask`; each destination CTA's
// mbarrier at the offset of `bar` receives the transaction bytes.
DG_DEVICE void tma_load_2d_multicast(void* smem_dst, const TmaDescriptor* desc, u64* bar, i32 inner, i32 outer,
                                     u16 cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(smem_dst)),
        "l"(reinterpret_cast<u64>(desc)), "r"(smem_addr(bar)), "r"(inner), "r"(outer), "h"(cta_mask)
        : "memory");
}

}  // namespace deepgemm::ptx
