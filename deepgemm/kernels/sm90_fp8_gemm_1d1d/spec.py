"""What gets compiled for the k-grouped FP8 GEMM with 1D1D scaling (MoE expert weight gradient)."""

from __future__ import annotations

from dataclasses import dataclass

from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.kernels.common.hopper import SMEM_CAPACITY
from deepgemm.utils import align_up, ceil_div

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


# The tile order (the kernel's kGroupRows). In the plain order (N-block fastest) a wave of ~132 CTAs covers every
# N-block of ceil(132 / N-blocks) M-blocks, so where N spans more than 16 N-blocks each wave reads all of B again, and
# B's panels over a group's tokens outgrow the L2 before the next wave reuses them (N = 7168, ~8192 tokens: 59 MB).
# Bands of BAND_ROWS M-blocks keep a wave on 8 M-blocks x ~16 N-blocks (by count B then comes from DRAM ~4 times
# per group at M = 4096 instead of ~11).
# H100, 2026-12-06 (dev/kgrouped_fp8_epilogue_ab.py, 128 x 160, C = out, two interleaved runs, DeepGEMM HEAD
# 2449 / 2445 us): 4 x ~8192 tokens, 4096 x 7168: plain 2773 / 2733 us, bands of 4 / 8 / 16 / 32 0.93-0.96 / 0.87 /
# 0.88-0.89 / 0.86; 8 x ~4096, 4096 x 7168: bands 0.975-0.987; at N = 2048 (13 N-blocks) bands of 4 and 8 level,
# 16 and 32 2% slower (the H200: bands of 16 at 128 x 160 0.2-1.7% slower on all four cases, 2026-12-05).
BAND_ROWS = 8
BAND_MIN_N_BLOCKS = 17


def kgrouped_group_rows(m: int, n: int, block_n: int) -> int:
    """The raster band of an M x N k-grouped GEMM on block_n-wide tiles: 1 (the plain order) unless N spans at least
    BAND_MIN_N_BLOCKS N-blocks, then BAND_ROWS M-blocks (all of them when there are fewer)."""
    m_blocks = ceil_div(max(m, 1), BLOCK_M)
    if m_blocks < 2 or ceil_div(max(n, 1), block_n) < BAND_MIN_N_BLOCKS:
        return 1
    return min(BAND_ROWS, m_blocks)


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
                  group_rows: int | None = None, block_n: int | None = None) -> KGroupedSpec:
        """The build a shape uses: the default block_n (kgrouped_block_n), store_n (store_columns) and raster band
        (kgrouped_group_rows) unless given; as many stages as fit."""
        block_n = kgrouped_block_n(n) if block_n is None else block_n
        chunk = store_columns(block_n, n) if store_n is None else store_n
        if group_rows is None:  # (a block_n of 0 is refused below)
            group_rows = kgrouped_group_rows(m, n, block_n) if block_n > 0 else 1
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
