"""What gets compiled for the k-grouped FP8 GEMM with 1D1D scaling (MoE expert weight gradient)."""

from __future__ import annotations

from dataclasses import dataclass

from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.kernels.common.hopper import SMEM_CAPACITY
from deepgemm.utils import align_up

BLOCK_M = 128
BLOCK_K = 128
THREADS = 384


MAX_BLOCK_N = 160  # wider tiles form the scale products after the wait (the kernel's kEarlyScaleProducts)


def kgrouped_block_n(n: int) -> int:
    """160 columns per tile, or N rounded up to 16 when N is narrower. H200, 2026-12-05 (dev/kgrouped_fp8_epilogue_ab.py,
    C = out by reduce-add, interleaved): 128 x 160 ran 4-6% faster than 128 x 128 and 128 x 144 on all four MoE
    k-grouped cases (N = 7168 and N = 2048, whose 12.8 N-blocks leave the last one partial), and 5-6% faster than
    DeepGEMM HEAD's 128 x 152: a 128-wide tile's shared-memory traffic caps its tensor rate near 80%."""
    return min(MAX_BLOCK_N, align_up(max(n, 1), 16))


def tma_stores(n: int) -> bool:
    """Whether D can be stored by TMA (FP32 rows of whole 16-byte units), else it is written from registers."""
    return n % 4 == 0


def store_columns(block_n: int, n: int) -> int:
    """The default TMA epilogue chunk (output columns per staging buffer): 32 (128-byte rows) where they divide
    block_n, else 16; 0 (stores straight from registers) where N % 4 != 0."""
    if not tma_stores(n):
        return 0
    return 32 if block_n % 32 == 0 else 16


def kgrouped_smem_bytes(block_n: int, stages: int, store_n: int) -> int:
    """Mirrors Sm90Fp8GemmKGrouped1D1D::kSmemBytes: the stages, and with TMA stores (store_n 16 or 32) two staging
    buffers of 64 rows x store_n FP32 per math warpgroup (each a whole number of 1 KiB)."""
    stage = BLOCK_M * BLOCK_K + block_n * BLOCK_K + BLOCK_M * 4 + align_up(block_n * 4, 128)
    staging = 2 * 2 * align_up(64 * store_n * 4, 1024) if store_n else 0
    return stages * stage + staging + 2 * stages * 8


def kgrouped_stages(block_n: int, store_n: int) -> int:
    stages = 2
    while stages < 16 and kgrouped_smem_bytes(block_n, stages + 1, store_n) <= SMEM_CAPACITY:
        stages += 1
    return stages


@dataclass(frozen=True)
class KGroupedSpec:
    """One instantiation: M and N are compiled in; groups and their K extents stay run-time values. c_in_place: C is
    the output itself, added by TMA reduce-add stores; store_n: the TMA epilogue's chunk columns (16 or 32), 0 for
    stores straight from registers (N % 4 != 0)."""

    m: int
    n: int
    block_n: int
    num_stages: int
    c_in_place: bool = False
    store_n: int = 0
    group_rows: int = 1  # each group's tiles in bands of this many M-blocks (1: N-block fastest in an M-block)

    def __post_init__(self) -> None:
        if self.block_n % 16 or not 16 <= self.block_n <= MAX_BLOCK_N:
            raise ValueError(f"block_n must be a multiple of 16 in [16, {MAX_BLOCK_N}], got {self.block_n}")
        if self.group_rows < 1:
            raise ValueError(f"group_rows must be at least 1, got {self.group_rows}")
        chunk = self.store_n
        if chunk not in (0, 16, 32) or (chunk and (self.block_n % chunk or not tma_stores(self.n))):
            raise ValueError(f"store_n {self.store_n}: 0, or 16 / 32 dividing block_n {self.block_n} with N % 4 == 0 "
                             f"(N = {self.n})")
        if self.c_in_place and not self.store_n:
            raise ValueError(f"in-place reduce-add stores are TMA stores: store_n 16 or 32 (N = {self.n})")

    @classmethod
    def for_shape(cls, m: int, n: int, c_in_place: bool = False, store_n: int | None = None,
                  group_rows: int = 1, block_n: int | None = None) -> KGroupedSpec:
        """The build a shape uses: the default block_n (kgrouped_block_n) and store_n (store_columns) unless given;
        as many stages as fit."""
        block_n = kgrouped_block_n(n) if block_n is None else block_n
        chunk = store_columns(block_n, n) if store_n is None else store_n
        return cls(m, n, block_n, kgrouped_stages(block_n, chunk), c_in_place, chunk, group_rows)

    @property
    def smem_bytes(self) -> int:
        return kgrouped_smem_bytes(self.block_n, self.num_stages, self.store_n)

    def label(self) -> str:
        c = " c=out" if self.c_in_place else ""
        store = f" store{self.store_n}" if self.store_n else ""
        band = f" g{self.group_rows}" if self.group_rows != 1 else ""
        return (f"k_grouped_fp8_gemm_tn m={self.m} n={self.n}{c} bm{BLOCK_M} bn{self.block_n} st{self.num_stages}"
                f"{store}{band}")


def render_source(spec: KGroupedSpec) -> KernelSource:
    code = f"""\
#include <deepgemm/impls/sm90_fp8_gemm_1d1d.cuh>

using Kernel = deepgemm::Sm90Fp8GemmKGrouped1D1D<{spec.m}u, {spec.n}u, {spec.block_n}u, {spec.num_stages}u,
                                                {"true" if spec.c_in_place else "false"}, {spec.store_n}u,
                                                {spec.group_rows}u>;
static_assert(Kernel::kSmemBytes == {spec.smem_bytes}u, "host and device disagree on the shared-memory size");

extern "C" __global__ void __launch_bounds__(Kernel::kNumThreads, 1)
deepgemm_fp8_gemm_kgrouped_1d1d(const __grid_constant__ deepgemm::TmaDescriptor tma_a,
                                const __grid_constant__ deepgemm::TmaDescriptor tma_b,
                                const __grid_constant__ deepgemm::TmaDescriptor tma_sfa,
                                const __grid_constant__ deepgemm::TmaDescriptor tma_sfb,
                                const __grid_constant__ deepgemm::OutputDescriptors tma_d,
                                const int* k_offsets, deepgemm::u32 num_groups, float* d, const float* c) {{
    Kernel::run(&tma_a, &tma_b, &tma_sfa, &tma_sfb, &tma_d, deepgemm::KGroupedProblem{{k_offsets, num_groups, d, c}});
}}
"""
    return KernelSource(code=code, entry="deepgemm_fp8_gemm_kgrouped_1d1d", label=spec.label())


def compile_spec(spec: KGroupedSpec) -> CompiledKernel:
    return compile_kernel(render_source(spec))
