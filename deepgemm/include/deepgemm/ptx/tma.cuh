// TMA (cp.async.bulk.tensor) loads into shared memory and stores from it, for 2-D and 3-D tensor maps.
#pragma once
#include <deepgemm/ptx/sync.cuh>

namespace deepgemm::ptx {

DG_DEVICE void tma_prefetch_descriptor(const TmaDescriptor* desc) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(desc)) : "memory");
}

// Load the box at (inner, outer) into `smem_dst`; completion is signalled on `bar` as transaction bytes.
// Out-of-bounds elements of the box are filled with zeros.
DG_DEVICE void tma_load_2d(void* smem_dst, const TmaDescriptor* desc, u64* bar, i32 inner, i32 outer) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_addr(smem_dst)),
        "l"(reinterpret_cast<u64>(desc)), "r"(smem_addr(bar)), "r"(inner), "r"(outer)
        : "memory");
}

// Load the box at (c0, c1, c2) of a 3-D tensor (c0 innermost) into `smem_dst`, completing bytes on `bar`.
DG_DEVICE void tma_load_3d(void* smem_dst, const TmaDescriptor* desc, u64* bar, i32 c0, i32 c1, i32 c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
            smem_addr(smem_dst)),
        "l"(reinterpret_cast<u64>(desc)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Store the box at (inner, outer) from `smem_src`; elements outside the tensor are not written.
DG_DEVICE void tma_store_2d(const TmaDescriptor* desc, const void* smem_src, i32 inner, i32 outer) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<u64>(desc)),
                 "r"(smem_addr(smem_src)), "r"(inner), "r"(outer)
                 : "memory");
}

// Store the box at (c0, c1, c2) of a 3-D tensor (c0 innermost) from `smem_src`, clipped to the tensor.
DG_DEVICE void tma_store_3d(const TmaDescriptor* desc, const void* smem_src, i32 c0, i32 c1, i32 c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<u64>(desc)),
                 "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

// The same boxes added element-wise into the tensor instead of stored (the tensor map's element type; for
// FP32 one rounding per element, as a load-add-store would give, done in L2).
DG_DEVICE void tma_reduce_add_2d(const TmaDescriptor* desc, const void* smem_src, i32 inner, i32 outer) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<u64>(desc)),
                 "r"(smem_addr(smem_src)), "r"(inner), "r"(outer)
                 : "memory");
}

DG_DEVICE void tma_reduce_add_3d(const TmaDescriptor* desc, const void* smem_src, i32 c0, i32 c1, i32 c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<u64>(desc)),
                 "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

DG_DEVICE void tma_store_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Wait until at most kPending committed store groups are still reading shared memory.
template <int kPending>
DG_DEVICE void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Wait until at most kPending committed store groups are still in flight (writes complete).
template <int kPending>
DG_DEVICE void tma_store_wait() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace deepgemm::ptx
