"""Plan and compile, before serving, the kernels that calls of given shapes will load.

The planners build the very specs the launch paths build (``planned_spec`` for ``fp8_gemm_nt``, ``grouped_spec``
for the MoE layouts, the quantizer's own source), so every kernel compiled here is a memo or disk-cache hit when
those shapes run. No GPU is needed: a ``Target`` says which SM count and GPU model (tuned table) to plan for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import torch

from deepgemm.api.gemm import planned_spec
from deepgemm.api.grouped import MASKED_M_ALIGNMENT, get_m_alignment_for_contiguous_layout
from deepgemm.jit.compiler import KernelSource, compile_kernel_outcome, compile_stats, default_cache_dir
from deepgemm.kernels.common.device import device_name, planning_sm_count
from deepgemm.kernels.common.elements import ELEMENT_KINDS
from deepgemm.kernels.quantize_fp8.launch import block_source, token_group_source, transposed_source
from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import KGroupedSpec
from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import render_source as render_kgrouped_source
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, grouped_spec
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, render_source
from deepgemm.utils import align_up

ACTIVATION_GROUP = 128  # the GEMMs read activation scales per 1x128 group
DEFAULT_TOKENS = tuple(1 << i for i in range(14))  # token counts to plan for: 1, 2, 4, ..., 8192


@dataclass(frozen=True)
class Target:
    """What kernels are planned for: the SMs a launch spreads over, and the GPU model whose tuned table picks dense
    tiles, spelled as torch.cuda.get_device_name() does (None: the cost model alone, as without a GPU)."""

    num_sms: int
    gpu_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_sms, bool) or not isinstance(self.num_sms, int) or self.num_sms < 1:
            raise ValueError(f"num_sms must be a positive int, got {self.num_sms!r}")


def local_target(num_sms: int | None = None, gpu_name: str | None = None) -> Target:
    """The runtime's own target, either part overridden: this GPU's SM count (DEEPGEMM_NUM_SMS caps it) and name;
    without a GPU, 132 SMs (H100/H200 SXM) and no name."""
    if gpu_name is None and torch.cuda.is_available():
        gpu_name = device_name(torch.cuda.current_device())
    return Target(planning_sm_count() if num_sms is None else num_sms, gpu_name)


def token_counts(tokens: Iterable[int]) -> tuple[int, ...]:
    """The distinct token counts (GEMM rows) to plan for, ascending; ValueError unless all are positive ints."""
    counts = tuple(tokens)
    bad = [t for t in counts if isinstance(t, bool) or not isinstance(t, int) or t < 1]
    if bad:
        raise ValueError(f"token counts must be positive ints, got {bad}")
    if not counts:
        raise ValueError("no token counts to plan for")
    return tuple(sorted(set(counts)))


# ---------------------------------------------------------------- kernels of one call


def dense_kernel(m: int, n: int, k: int, out_dtype: torch.dtype, target: Target) -> Fp8GemmSpec:
    """The kernel fp8_gemm_nt loads for A [m, k] x B [n, k]^T: the tuned choice of the target's GPU, else the
    cost model's."""
    return planned_spec(m, n, k, out_dtype, target.num_sms, target.gpu_name)


def contiguous_kernel(m_total: int, groups: int, n: int, k: int, out_dtype: torch.dtype,
                      target: Target) -> Fp8GemmSpec:
    """The kernel m_grouped_fp8_gemm_nt_contiguous loads for A of m_total rows and B of `groups` experts."""
    geometry = Geometry(rows=m_total, groups=groups)
    return grouped_spec(GemmKind.GROUPED_CONTIGUOUS, geometry, n, k, out_dtype, m_total, target.num_sms)


def masked_kernel(expected_m: int, max_m: int, groups: int, n: int, k: int, out_dtype: torch.dtype,
                  target: Target) -> Fp8GemmSpec:
    """The kernel m_grouped_fp8_gemm_nt_masked loads for A [groups, max_m, k] with this expected_m hint."""
    geometry = Geometry(rows=groups * max_m, groups=groups, max_m=max_m, tiles_known=False)
    return grouped_spec(GemmKind.GROUPED_MASKED, geometry, n, k, out_dtype, expected_m, target.num_sms)


def quantizer_kernel(input_dtype: torch.dtype, group_size: int = ACTIVATION_GROUP,
                     silu_mul: bool = False) -> KernelSource:
    """The per-token-group quantizer quantize_per_token_group (silu_mul: silu_mul_quantize_per_token_group) loads
    for inputs of `input_dtype` (it depends on nothing else: one kernel serves every shape)."""
    if input_dtype not in ELEMENT_KINDS:
        raise TypeError(f"input dtype must be one of {tuple(ELEMENT_KINDS)}, got {input_dtype}")
    return token_group_source(input_dtype, group_size, silu_mul)


def training_kernels(tokens: int, n: int, k: int, x_dtype: torch.dtype, weight_dtype: torch.dtype,
                     out_dtype: torch.dtype, target: Target) -> list[Kernel]:
    """The kernels one FP8 training step of fp8_linear loads (x [tokens, k] in x_dtype, W [n, k] in weight_dtype,
    the output and its gradient in out_dtype, both gradients wanted): Fprop and Dgrad GEMMs, the Wgrad 1D1D GEMM
    (one group), x's both-ways quantizer, W's per-block quantizer with its transpose, dy's row and transposed
    quantizers; and what a forward without grad mode adds (the row quantizer of x, W's plain per-block quantizer)."""
    for dtype in (x_dtype, weight_dtype, out_dtype):
        if dtype not in ELEMENT_KINDS:
            raise TypeError(f"dtypes must be one of {tuple(ELEMENT_KINDS)}, got {dtype}")
    x_gemm = torch.float32 if x_dtype == torch.float32 else torch.bfloat16
    y_gemm = torch.float32 if out_dtype == torch.float32 else torch.bfloat16
    return [dense_kernel(tokens, n, k, y_gemm, target), dense_kernel(tokens, k, n, x_gemm, target),
            render_kgrouped_source(KGroupedSpec.for_shape(n, k)), transposed_source(x_dtype, rows_too=True),
            block_source(weight_dtype, 128, transposed=True), token_group_source(out_dtype, ACTIVATION_GROUP),
            transposed_source(out_dtype), token_group_source(x_dtype, ACTIVATION_GROUP), block_source(weight_dtype, 128)]


# ---------------------------------------------------------------- MoE rows as engines lay them out


def contiguous_m_total(tokens: int, topk: int, experts: int) -> int:
    """M_total of the contiguous layout when `tokens` tokens each pick `topk` of `experts` experts, routed evenly
    over min(experts, tokens * topk) experts, each expert's segment padded to
    get_m_alignment_for_contiguous_layout() rows."""
    routed = tokens * topk
    active = min(experts, routed)
    per_expert, extra = divmod(routed, active)
    alignment = get_m_alignment_for_contiguous_layout()
    return extra * align_up(per_expert + 1, alignment) + (active - extra) * align_up(per_expert, alignment)


def masked_rows(tokens: int, topk: int, experts: int) -> tuple[int, int]:
    """(expected_m, max_m) of the masked layout for `tokens` tokens each picking `topk` of `experts` experts:
    expected_m as DeepEP-based engines pass it, (tokens * topk + experts) // experts; max_m, the most rows one
    expert can receive (a token picks an expert once), rounded up to the layout's 64 rows. The tile choice reads
    max_m only as a cap far above expected_m, so an engine's larger dispatch buffer picks the same kernel."""
    return (tokens * topk + experts) // experts, align_up(tokens, MASKED_M_ALIGNMENT)


def moe_kernels(tokens: int, topk: int, experts: int, n: int, k: int, out_dtype: torch.dtype,
                target: Target) -> list[Fp8GemmSpec]:
    """The kernels of one expert GEMM ([experts, n, k] weights) at `tokens` tokens, in both layouts an engine may
    run it: contiguous (prefill) and masked (decode)."""
    expected_m, max_m = masked_rows(tokens, topk, experts)
    return [contiguous_kernel(contiguous_m_total(tokens, topk, experts), experts, n, k, out_dtype, target),
            masked_kernel(expected_m, max_m, experts, n, k, out_dtype, target)]


Kernel = Fp8GemmSpec | KernelSource  # a GEMM instantiation, or a source ready to compile


def unique_sources(kernels: Iterable[Kernel]) -> list[KernelSource]:
    """The distinct sources to compile, in first-seen order: shapes that share a kernel compile it once."""
    sources = (kernel if isinstance(kernel, KernelSource) else render_source(kernel) for kernel in kernels)
    return list(dict.fromkeys(sources))


# ---------------------------------------------------------------- compiling


@dataclass(frozen=True)
class KernelDone:
    """One finished kernel, for a progress callback: `done` of `total` finished, the last one's label and time, and
    whether it was `cached` (found in the disk cache or this process's memo, nothing compiled; milliseconds)."""

    done: int
    total: int
    label: str
    seconds: float
    cached: bool = False


Progress = Callable[[KernelDone], None]


@dataclass(frozen=True)
class PrecompileSummary:
    """What a precompile did: `kernels` planned, `compiled` now, `cached` already (disk cache or this process's
    memo), the wall time and the cache directory.

    Returned by:
        deepgemm.precompile_model (and the `deepgemm precompile` command's planner).

    Example::

        summary: deepgemm.nn.PrecompileSummary = deepgemm.precompile_model(model, tokens=(1, 8, 64, 4096))
        print(summary)                      # "12 kernels: 12 compiled, 0 already cached, 41.0 s; cache ..."
        assert summary.compiled + summary.cached == summary.kernels
    """

    kernels: int
    compiled: int
    cached: int
    seconds: float
    cache_dir: Path

    def __str__(self) -> str:
        return (f"{self.kernels} kernels: {self.compiled} compiled, {self.cached} already cached, "
                f"{self.seconds:.1f} s; cache {self.cache_dir}")


def compile_sources(sources: Sequence[KernelSource], *, workers: int | None = None,
                    progress: Progress | None = None) -> PrecompileSummary:
    """Compile `sources` into the disk cache, `workers` at a time (default os.cpu_count(): each compile runs NVRTC
    in its own worker process, so N threads are N compilers). The first failure cancels what has not started and
    is raised. Compiled and cached counts come from the process-wide compile_stats, so they include compiles that
    other threads of this process run meanwhile."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    start, before = time.perf_counter(), compile_stats()
    if sources:
        with ThreadPoolExecutor(max_workers=min(workers or os.cpu_count() or 1, len(sources))) as pool:
            futures = {pool.submit(_timed_compile, source): source for source in sources}
            try:
                for done, future in enumerate(as_completed(futures), 1):
                    seconds, cached = future.result()
                    if progress is not None:
                        source = futures[future]
                        progress(KernelDone(done, len(sources), source.label or source.entry, seconds, cached))
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    counts = compile_stats() - before
    return PrecompileSummary(kernels=len(sources), compiled=counts.compiled, cached=counts.disk_hits + counts.memo_hits,
                             seconds=time.perf_counter() - start, cache_dir=default_cache_dir())


def _timed_compile(source: KernelSource) -> tuple[float, bool]:
    """Seconds the kernel took, and whether it came from a cache rather than a compile."""
    start = time.perf_counter()
    _, outcome = compile_kernel_outcome(source)
    return time.perf_counter() - start, outcome != "compiled"
