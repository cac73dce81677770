"""What gets compiled for the FP8 1D2D GEMM: the instantiation (template arguments), its source, its compile."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.kernels.common.hopper import elem_bytes
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind
from deepgemm.utils import align_up, ceil_div

OUT_DTYPES = (torch.bfloat16, torch.float32)

_NAMES = {GemmKind.DENSE: "fp8_gemm_nt", GemmKind.GROUPED_CONTIGUOUS: "m_grouped_fp8_gemm_nt_contiguous",
          GemmKind.GROUPED_MASKED: "m_grouped_fp8_gemm_nt_masked",
          GemmKind.GROUPED_CONTIGUOUS_PSUM: "m_grouped_fp8_gemm_nt_contiguous_psum"}


@dataclass(frozen=True)
class Fp8GemmSpec:
    """Everything that is compiled into one instantiation (M and the group counts stay run-time arguments)."""

    n: int
    k: int
    out_dtype: torch.dtype
    config: GemmConfig
    kind: GemmKind = GemmKind.DENSE

    @property
    def out_elem_bytes(self) -> int:
        return elem_bytes(self.out_dtype)

    def label(self) -> str:
        out = "fp32" if self.out_dtype == torch.float32 else "bf16"
        wide = "" if self.config.narrow_last_n else " wide-last-n"
        return f"{_NAMES[self.kind]} n={self.n} k={self.k} out={out} {self.config.label()}{wide}"


def a_box_rows(kind: GemmKind, block_m: int) -> int:
    """Rows per TMA box of A; mirrors kLoadRowsA: masked tiles load only the boxes their valid rows need."""
    if kind == GemmKind.GROUPED_MASKED:
        return 16 if block_m == 64 else 64
    return block_m


def last_box_rows_b(spec: Fp8GemmSpec) -> int:
    """Rows per TMA box of B for the last N-block; mirrors kLastBoxRowsB: its columns rounded up to 8 when N leaves
    that block partial (narrow last block), else block_n."""
    block_n = spec.config.block_n
    last = align_up(spec.n - (ceil_div(spec.n, block_n) - 1) * block_n, 8)
    return last if spec.config.cluster_size == 1 and last < block_n and spec.config.narrow_last_n else block_n


def render_source(spec: Fp8GemmSpec) -> KernelSource:
    c = spec.config
    fp32 = "true" if spec.out_dtype == torch.float32 else "false"
    cluster_n = f", {c.cluster_n}u" if c.cluster_n != 1 else ""  # (a trailing default: other kernels' source unchanged)
    code = f"""\
#include <deepgemm/impls/sm90_fp8_gemm_1d2d.cuh>

using Kernel = deepgemm::Sm90Fp8Gemm1D2D<{spec.n}u, {spec.k}u, {c.block_m}u, {c.block_n}u, {c.num_stages}u, {c.group_m}u,
                                         {c.cluster_m}u, {"true" if c.pipelined else "false"}, {fp32},
                                         static_cast<deepgemm::GemmKind>({int(spec.kind)}), deepgemm::TailMode::{tail_mode(c)},
                                         {"true" if c.chunked_store else "false"}, {"true" if c.narrow_last_n else "false"}{cluster_n}>;
static_assert(Kernel::kSmemBytes == {c.smem_bytes}u, "host and device disagree on the shared-memory size");
static_assert(Kernel::kLoadRowsA == {a_box_rows(spec.kind, c.block_m)}u, "host and device disagree on A's TMA box rows");
static_assert(Kernel::kLastBoxRowsB == {last_box_rows_b(spec)}u, "host and device disagree on B's last box");

extern "C" __global__ void __launch_bounds__(Kernel::kNumThreads, 1)
deepgemm_fp8_gemm_1d2d(const __grid_constant__ deepgemm::TmaDescriptor tma_a, const __grid_constant__ deepgemm::TmaDescriptor tma_b,
                const __grid_constant__ deepgemm::TmaDescriptor tma_sfa, const __grid_constant__ deepgemm::TmaDescriptor tma_a_last,
                const __grid_constant__ deepgemm::TmaDescriptor tma_sfa_last, const __grid_constant__ deepgemm::TmaDescriptor tma_b_last,
                const __grid_constant__ deepgemm::OutputDescriptors tma_d,
                const float* sfb, deepgemm::u32 m, const int* grouping, deepgemm::u32 num_groups, deepgemm::u32 max_m,
                float* workspace, deepgemm::u32* counters) {{
    Kernel::run(&tma_a, &tma_b, &tma_sfa, &tma_a_last, &tma_sfa_last, &tma_b_last, &tma_d, sfb, deepgemm::GemmProblem{{m, grouping, num_groups, max_m, workspace, counters}});
}}
"""
    return KernelSource(code=code, entry="deepgemm_fp8_gemm_1d2d", label=spec.label())


def tail_mode(config: GemmConfig) -> str:
    """The kernel's TailMode for a config: whole tiles, an evenly split tail or a stream tail."""
    return "kStream" if config.stream_tail else ("kSplit" if config.split_tail else "kWhole")


def compile_spec(spec: Fp8GemmSpec) -> CompiledKernel:
    """Compile (or fetch from the cache) without loading: works on machines without a GPU."""
    return compile_kernel(render_source(spec))
