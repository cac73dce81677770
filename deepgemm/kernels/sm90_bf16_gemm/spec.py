"""What gets compiled for the BF16 GEMM: layout, output and addend types, tile config; its source and compile."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.kernels.common.hopper import elem_bytes
from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm.config import Bf16GemmConfig

LAYOUTS = ("nt", "nn", "tn", "tt")
ADDEND_NONE, ADDEND_BF16, ADDEND_FP32 = 0, 1, 2
ADDEND_IN_PLACE = 3  # C is the FP32 output itself: the tile is added by TMA reduce-add stores, C is never loaded
THREADS_PRODUCER = 128


def a_mn_major(layout: str) -> bool:
    """A given as [K, M] (M contiguous): the `t` in first place."""
    return layout[0] == "t"


def b_mn_major(layout: str) -> bool:
    """B given as [K, N] (N contiguous): the `n` in second place."""
    return layout[1] == "n"


def addend_kind(c_dtype: torch.dtype | None, in_place: bool = False) -> int:
    """The kernel's addend kind: none, BF16 or FP32 C loaded in the epilogue, or an FP32 C that is the output itself
    (`in_place`)."""
    if c_dtype is None:
        return ADDEND_NONE
    if c_dtype != torch.float32:
        return ADDEND_BF16
    return ADDEND_IN_PLACE if in_place else ADDEND_FP32


# The public operation each kind serves (the kernel's label).
KIND_NAMES = {GemmKind.GROUPED_CONTIGUOUS: "m_grouped_bf16_gemm_nt_contiguous",
              GemmKind.GROUPED_CONTIGUOUS_PSUM: "m_grouped_bf16_gemm_nt_contiguous_psum",
              GemmKind.GROUPED_MASKED: "m_grouped_bf16_gemm_nt_masked",
              GemmKind.K_GROUPED: "k_grouped_bf16_gemm_tn_contiguous"}


@dataclass(frozen=True)
class Bf16GemmSpec:
    """One instantiation: N, K, the layout, the output dtype, the addend kind, the GEMM kind and the tile config
    (M, the groups and the grouping stay run-time; k-grouped has k = 0: each group's K range is run-time)."""

    n: int
    k: int
    layout: str
    out_dtype: torch.dtype
    addend: int
    config: Bf16GemmConfig
    kind: GemmKind = GemmKind.DENSE

    def __post_init__(self) -> None:
        expected = {GemmKind.DENSE: None, GemmKind.K_GROUPED: "tn"}.get(self.kind, "nt")
        if expected is not None and self.layout != expected:
            raise ValueError(f"{self.kind.name} BF16 kernels are {expected}, not {self.layout}")
        if self.config.split_k and self.kind != GemmKind.DENSE:
            raise ValueError(f"split-K is for dense BF16 GEMMs, not {self.kind.name}")
        if self.addend == ADDEND_IN_PLACE and self.out_dtype != torch.float32:
            raise ValueError("in-place reduce-add stores need an FP32 output")

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes(elem_bytes(self.out_dtype))

    def label(self) -> str:
        out = "fp32" if self.out_dtype == torch.float32 else "bf16"
        c = ("", " c=bf16", " c=fp32", " c=out")[self.addend]
        name = KIND_NAMES.get(self.kind, f"bf16_gemm_{self.layout}")
        k = "" if self.kind == GemmKind.K_GROUPED else f" k={self.k}"
        return f"{name} n={self.n}{k} out={out}{c} {self.config.label()}"


def render_source(spec: Bf16GemmSpec) -> KernelSource:
    c = spec.config
    flag = {True: "true", False: "false"}
    store_n = f", {c.store_n}u" if c.store_n else ""  # (absent: one staging buffer, the template's default)
    code = f"""\
#include <deepgemm/impls/sm90_bf16_gemm.cuh>

using Kernel = deepgemm::Sm90Bf16Gemm<{spec.n}u, {spec.k}u, {c.block_m}u, {c.block_n}u, {c.num_stages}u, {c.group_rows}u,
                                      {flag[a_mn_major(spec.layout)]}, {flag[b_mn_major(spec.layout)]},
                                      {flag[spec.out_dtype == torch.float32]}, {spec.addend}u,
                                      static_cast<deepgemm::GemmKind>({int(spec.kind)}), {flag[c.split_k]}{store_n}>;
static_assert(Kernel::kSmemBytes == {spec.smem_bytes}u, "host and device disagree on the shared-memory size");

extern "C" __global__ void __launch_bounds__(Kernel::kNumThreads, 1)
deepgemm_bf16_gemm(const __grid_constant__ deepgemm::TmaDescriptor tma_a,
                   const __grid_constant__ deepgemm::TmaDescriptor tma_a_last,
                   const __grid_constant__ deepgemm::TmaDescriptor tma_b,
                   const __grid_constant__ deepgemm::OutputDescriptors tma_d, deepgemm::u32 m, const deepgemm::i32* grouping,
                   deepgemm::u32 num_groups, deepgemm::u32 max_m, const void* c, deepgemm::u32 c_stride,
                   float* workspace, deepgemm::u32* counters) {{
    const deepgemm::GemmProblem tiles{{m, grouping, num_groups, max_m, workspace, counters}};
    Kernel::run(&tma_a, &tma_a_last, &tma_b, &tma_d, deepgemm::Bf16GemmProblem{{tiles, c, c_stride}});
}}
"""
    return KernelSource(code=code, entry="deepgemm_bf16_gemm", label=spec.label())


def compile_spec(spec: Bf16GemmSpec) -> CompiledKernel:
    """Compile (or fetch from the cache) without loading: works on machines without a GPU."""
    return compile_kernel(render_source(spec))
