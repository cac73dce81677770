"""FP8 GEMM with 1x128 (A) and 128x128 (B) scales: instantiation, compile, and launch plans."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import torch

from deepgemm.api.layout import mn_major_row_stride, tma_row_stride
from deepgemm.configs import GemmConfig, choose_fp8_gemm_config
from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream
from deepgemm.jit.tma import encode_2d
from deepgemm.kernels.device import sm_count
from deepgemm.kernels.loader import load_kernel
from deepgemm.utils import ceil_div

OUT_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Fp8GemmSpec:
    """Everything that is compiled into one instantiation (M stays a run-time argument)."""

    n: int
    k: int
    out_dtype: torch.dtype
    config: GemmConfig

    @property
    def out_elem_bytes(self) -> int:
        return 4 if self.out_dtype == torch.float32 else 2

    def label(self) -> str:
        out = "fp32" if self.out_dtype == torch.float32 else "bf16"
        return f"fp8_gemm_nt n={self.n} k={self.k} out={out} {self.config.label()}"


def plan_spec(m: int, n: int, k: int, out_dtype: torch.dtype, num_sms: int) -> Fp8GemmSpec:
    config = choose_fp8_gemm_config(m, n, k, num_sms, 4 if out_dtype == torch.float32 else 2)
    return Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config)


def render_source(spec: Fp8GemmSpec) -> KernelSource:
    c = spec.config
    fp32 = "true" if spec.out_dtype == torch.float32 else "false"
    code = f"""\
#include <deepgemm/kernels/sm90_fp8_gemm_1d2d.cuh>

using Kernel = deepgemm::Sm90Fp8Gemm1D2D<{spec.n}u, {spec.k}u, {c.block_m}u, {c.block_n}u, {c.num_stages}u, {c.group_m}u,
                                         {c.cluster_m}u, {"true" if c.pipelined else "false"}, {fp32}>;
static_assert(Kernel::kSmemBytes == {c.smem_bytes}u, "host and device disagree on the shared-memory size");

extern "C" __global__ void __launch_bounds__(Kernel::kNumThreads, 1)
deepgemm_fp8_gemm_1d2d(const __grid_constant__ deepgemm::TmaDescriptor tma_a, const __grid_constant__ deepgemm::TmaDescriptor tma_b,
                const __grid_constant__ deepgemm::TmaDescriptor tma_sfa, const __grid_constant__ deepgemm::OutputDescriptors tma_d,
                const float* sfb, deepgemm::u32 m) {{
    Kernel::run(&tma_a, &tma_b, &tma_sfa, &tma_d, sfb, m);
}}
"""
    return KernelSource(code=code, entry="deepgemm_fp8_gemm_1d2d", label=spec.label())


def compile_spec(spec: Fp8GemmSpec) -> CompiledKernel:
    """Compile (or fetch from the cache) without loading: works on machines without a GPU."""
    return compile_kernel(render_source(spec))


class Fp8GemmPlan:
    """Launch state for one (device, M, N, K, out dtype): kernel, grid, and packed arguments per pointer set."""

    _ARGS_CAPACITY = 1024

    def __init__(self, device_index: int, m: int, spec: Fp8GemmSpec, kernel: LoadedKernel) -> None:
        c = spec.config
        self.device_index = device_index
        self.m = m
        self.spec = spec
        self.kernel = kernel
        cluster_tiles = ceil_div(ceil_div(m, c.block_m), c.cluster_m) * ceil_div(spec.n, c.block_n)
        resident = c.num_sms // c.cluster_m
        if c.cluster_m > 1:
            # A persistent grid must be fully resident: some SMs may have no cluster partner.
            resident = min(resident, kernel.max_active_clusters(device_index, c.num_threads, c.cluster_m))
        self.grid = min(resident, cluster_tiles) * c.cluster_m
        self.block = c.num_threads
        self._args: dict[tuple[int, ...], PackedArgs] = {}
        self._configs: dict[int, object] = {}  # launch config per stream

    def _pack(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor) -> PackedArgs:
        c, m, n, k = self.spec.config, self.m, self.spec.n, self.spec.k
        fp8 = torch.float8_e4m3fn
        d_stride = tma_row_stride(d)
        d_elems_per_16b = 16 // d.element_size()
        output_descriptors = b"".join(
            encode_2d(d.data_ptr(), d.dtype, m, n, d_stride, 64, width // 16 * d_elems_per_16b, width if width > 16 else 0)
            for width in (128, 64, 32, 16)
        )
        return PackedArgs(
            [
                encode_2d(a.data_ptr(), fp8, m, k, tma_row_stride(a), c.block_m, c.block_k, 128),
                encode_2d(b.data_ptr(), fp8, n, k, tma_row_stride(b), c.block_n // c.cluster_m, c.block_k, 128),
                encode_2d(sfa.data_ptr(), torch.float32, ceil_div(k, 128), m, mn_major_row_stride(sfa), 1, c.block_m, 0),
                output_descriptors,
                U64(sfb.data_ptr()),
                U32(m),
            ]
        )

    def packed_args(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                    d: torch.Tensor) -> PackedArgs:
        """Kernel arguments (TMA descriptors + scalars) for these tensors, packed once per pointer set."""
        key = (a.data_ptr(), a.stride(0), sfa.data_ptr(), sfa.stride(1), b.data_ptr(), b.stride(0), sfb.data_ptr(),
               d.data_ptr(), d.stride(0))
        args = self._args.get(key)
        if args is None:
            if len(self._args) >= self._ARGS_CAPACITY:
                self._args.clear()
            args = self._args[key] = self._pack(a, sfa, b, sfb, d)
        return args

    def launch_packed(self, args: PackedArgs) -> None:
        stream = current_raw_stream(self.device_index)
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self.kernel.launch_config(
                self.device_index, stream, self.grid, self.block, self.spec.config.cluster_m)
        self.kernel.launch(config, args.address)

    def launch(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor) -> None:
        """Launch on the current stream; `sfa` must already be M-major and TMA-aligned, `sfb` contiguous."""
        self.launch_packed(self.packed_args(a, sfa, b, sfb, d))


_plans: dict[tuple[int, int, int, int, torch.dtype, GemmConfig | None], Fp8GemmPlan] = {}
_plans_lock = threading.Lock()


def get_plan(device_index: int, m: int, n: int, k: int, out_dtype: torch.dtype,
             config: GemmConfig | None = None) -> Fp8GemmPlan:
    """The plan for a shape; `config` overrides the heuristic's choice (used by the tuner)."""
    key = (device_index, m, n, k, out_dtype, config)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    if config is None:
        spec = plan_spec(m, n, k, out_dtype, sm_count(device_index))
    else:
        spec = Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config)
    if os.environ.get("DEEPGEMM_PRINT_CONFIGS"):
        print(f"deepgemm: m={m} {spec.label()}", file=sys.stderr)
    kernel = load_kernel(render_source(spec), spec.config.smem_bytes)
    with _plans_lock:
        plan = _plans.setdefault(key, Fp8GemmPlan(device_index, m, spec, kernel))
    return plan


