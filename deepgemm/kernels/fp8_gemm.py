"""FP8 GEMM with 1x128 (A) and 128x128 (B) scales: instantiation, compile, and launch plans."""

from __future__ import annotations

import enum
import os
import sys
import threading
from dataclasses import dataclass, field, replace

import torch

from deepgemm.api.layout import masked_sfa_strides, mn_major_row_stride, tma_row_stride
from deepgemm.configs import GemmConfig, choose_fp8_gemm_config
from deepgemm.configs.heuristics import (balanced_grid, balanced_grid_applies, contiguous_tile,
                                        make_config, masked_tile, max_block_n_for, spans_at_most_two_scale_blocks,
                                        split_tail_ranges, stream_tail_pieces)
from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device, stream_capturing
from deepgemm.jit.tma import encode_2d, encode_3d
from deepgemm.kernels.device import device_name, sm_count
from deepgemm.kernels.loader import load_kernel
from deepgemm.kernels.split_scratch import split_scratch
from deepgemm.utils import align_up, ceil_div

OUT_DTYPES = (torch.bfloat16, torch.float32)


class GemmKind(enum.IntEnum):
    """Mirrors deepgemm::GemmKind in sm90_fp8_gemm_1d2d.cuh."""

    DENSE = 0
    GROUPED_CONTIGUOUS = 1
    GROUPED_MASKED = 2
    GROUPED_CONTIGUOUS_PSUM = 3


def narrow_last_block_enabled() -> bool:
    """DEEPGEMM_NARROW_LAST_N=0 compiles full-width last N-blocks (an A/B switch, read once per spec: a plan's kernel
    and the descriptors packed for it always agree)."""
    return os.environ.get("DEEPGEMM_NARROW_LAST_N", "1") != "0"


@dataclass(frozen=True)
class Fp8GemmSpec:
    """Everything that is compiled into one instantiation (M and the group counts stay run-time arguments)."""

    n: int
    k: int
    out_dtype: torch.dtype
    config: GemmConfig
    kind: GemmKind = GemmKind.DENSE
    # A partial last N-block runs narrower MMAs from its own B box (DEEPGEMM_NARROW_LAST_N when the spec is made).
    narrow_last_n: bool = field(default_factory=narrow_last_block_enabled)

    @property
    def out_elem_bytes(self) -> int:
        return 4 if self.out_dtype == torch.float32 else 2

    def label(self) -> str:
        out = "fp32" if self.out_dtype == torch.float32 else "bf16"
        name = {GemmKind.DENSE: "fp8_gemm_nt", GemmKind.GROUPED_CONTIGUOUS: "m_grouped_fp8_gemm_nt_contiguous",
                GemmKind.GROUPED_MASKED: "m_grouped_fp8_gemm_nt_masked",
                GemmKind.GROUPED_CONTIGUOUS_PSUM: "m_grouped_fp8_gemm_nt_contiguous_psum"}[self.kind]
        return f"{name} n={self.n} k={self.k} out={out} {self.config.label()}" + ("" if self.narrow_last_n else " wide-last-n")


def plan_spec(m: int, n: int, k: int, out_dtype: torch.dtype, num_sms: int, gpu_name: str | None = None) -> Fp8GemmSpec:
    """The instantiation for a shape: a tuned choice for this GPU model if one is recorded, else the cost model."""
    out_elem_bytes = 4 if out_dtype == torch.float32 else 2
    config = None
    if gpu_name is not None:
        from deepgemm.configs.tuning_db import tuning_db

        config = tuning_db(gpu_name).lookup(m, n, k, num_sms, out_elem_bytes)
    if config is None:
        config = choose_fp8_gemm_config(m, n, k, num_sms, out_elem_bytes)
    if os.environ.get("DEEPGEMM_SPLIT_TAIL") == "1" and config.cluster_m == 1:
        config = replace(config, split_tail=True, stream_tail=False)  # experimental opt-in, see docs/perf-notes.md
    return Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config)


def a_box_rows(kind: GemmKind, block_m: int) -> int:
    """Rows per TMA box of A; mirrors kLoadRowsA: masked tiles load only the boxes their valid rows need."""
    if kind == GemmKind.GROUPED_MASKED:
        return 16 if block_m == 64 else 64
    return block_m


def dense_last_box_rows(block_m: int, rows: int) -> int:
    """Rows per TMA box of A and sfa for the last M-block of a dense GEMM of `rows` rows; mirrors
    dense_last_box_rows in the kernel: the block's rows rounded up to 8 (block_m when M fills it)."""
    rows = max(rows, 1)
    return align_up(rows - (ceil_div(rows, block_m) - 1) * block_m, 8)


def last_box_rows_b(spec: Fp8GemmSpec) -> int:
    """Rows per TMA box of B for the last N-block; mirrors kLastBoxRowsB: its columns rounded up to 8 when N leaves
    that block partial (narrow last block), else block_n."""
    block_n = spec.config.block_n
    last = align_up(spec.n - (ceil_div(spec.n, block_n) - 1) * block_n, 8)
    return last if spec.config.cluster_m == 1 and last < block_n and spec.narrow_last_n else block_n


def render_source(spec: Fp8GemmSpec) -> KernelSource:
    c = spec.config
    fp32 = "true" if spec.out_dtype == torch.float32 else "false"
    narrow = "" if spec.narrow_last_n else "#define DEEPGEMM_NARROW_LAST_N 0\n"
    code = f"""\
{narrow}#include <deepgemm/kernels/sm90_fp8_gemm_1d2d.cuh>

using Kernel = deepgemm::Sm90Fp8Gemm1D2D<{spec.n}u, {spec.k}u, {c.block_m}u, {c.block_n}u, {c.num_stages}u, {c.group_m}u,
                                         {c.cluster_m}u, {"true" if c.pipelined else "false"}, {fp32},
                                         static_cast<deepgemm::GemmKind>({int(spec.kind)}), deepgemm::TailMode::{tail_mode(c)},
                                         {"true" if c.chunked_store else "false"}>;
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


@dataclass(frozen=True)
class Geometry:
    """Run-time extent of a launch: the rows of the flattened A/D views and the group layout.

    dense: rows = M; contiguous: rows = M_total, groups = G; masked: rows = G * max_m, groups = G,
    max_m rows per group (a multiple of 64 so a 64-row store never crosses into the next group).
    """

    rows: int
    groups: int = 1
    max_m: int = 0
    tiles_known: bool = field(default=True)  # masked: tile count lives in device memory


class Fp8GemmPlan:
    """Launch state for one (device, kind, geometry, N, K, out dtype): kernel, grid, packed arguments."""

    _ARGS_CAPACITY = 1024

    def __init__(self, device_index: int, geometry: Geometry, spec: Fp8GemmSpec, kernel: LoadedKernel) -> None:
        c = spec.config
        self.device_index = device_index
        self.geometry = geometry
        self.spec = spec
        self.kernel = kernel
        resident = c.num_sms // c.cluster_m
        if c.cluster_m > 1:
            # A persistent grid must be fully resident: some SMs may have no cluster partner.
            resident = min(resident, kernel.max_active_clusters(device_index, c.num_threads, c.cluster_m))
        if geometry.tiles_known and not (c.split_tail or c.stream_tail):
            # (A split-tail grid keeps every SM: fewer tiles than SMs are then split along K.)
            cluster_tiles = ceil_div(ceil_div(geometry.rows, c.block_m), c.cluster_m) * ceil_div(spec.n, c.block_n)
            resident = min(resident, cluster_tiles)
            if resident > 0 and spec.kind == GemmKind.DENSE and balanced_grid_applies(spec.k):
                resident = balanced_grid(cluster_tiles, resident)  # every CTA the same number of tiles
        self.grid = max(resident, 1) * c.cluster_m
        self.block = c.num_threads
        self._args: dict[tuple[int, ...], PackedArgs] = {}
        self._configs: dict[int, object] = {}  # launch config per stream
        # Split plans, per stream: the last eager launch's arguments with their scratch pointers, valid while the
        # scratch generation stays the same (the tensors are held so that they outlive the launch).
        self._split_args: dict[int, tuple[int, PackedArgs, PackedArgs, torch.Tensor, torch.Tensor]] = {}
        if (c.split_tail or c.stream_tail) and (spec.kind != GemmKind.DENSE or c.cluster_m != 1):
            raise ValueError(f"split_tail and stream_tail need a dense GEMM without clusters, got {spec.label()}")
        # K ranges per tail tile, fixed per plan (dense plans have a fixed M): launches only test it.
        self._split_ranges = self.split_count()

    def _pack(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
              grouping: torch.Tensor | None) -> PackedArgs:
        c, g, n, k = self.spec.config, self.geometry, self.spec.n, self.spec.k
        rows = g.rows
        k_blocks = ceil_div(k, 128)
        fp8 = torch.float8_e4m3fn
        d_stride = d.stride(-2) if d.dim() == 3 else tma_row_stride(d)
        d_elems_per_16b = 16 // d.element_size()
        output_descriptors = b"".join(
            encode_2d(d.data_ptr(), d.dtype, rows, n, d_stride, 64, width // 16 * d_elems_per_16b, width if width > 16 else 0)
            for width in (128, 64, 32, 16)
        )
        a_stride = a.stride(-2) if a.dim() == 3 else tma_row_stride(a)
        b_stride = b.stride(-2) if b.dim() == 3 else tma_row_stride(b)
        a_rows_per_box = a_box_rows(self.spec.kind, c.block_m)
        a_desc = encode_2d(a.data_ptr(), fp8, rows, k, a_stride, a_rows_per_box, c.block_k, 128)
        if self.spec.kind == GemmKind.GROUPED_MASKED:
            # sfa [G, max_m, K/128], M contiguous: a 3-D box (M, K block, group), so any group stride works (M-major
            # per group, or a view of one M-major [G * max_m, K/128] tensor); a box never reads the next group.
            strides = masked_sfa_strides(sfa)
            if strides is None:
                raise ValueError(f"masked sfa strides {sfa.stride()} are not TMA-readable (the API copies such scales)")
            sfa_desc = encode_3d(sfa.data_ptr(), torch.float32, (g.max_m, k_blocks, g.groups), strides,
                                 (c.block_m, 1, 1))
        else:
            sfa_desc = encode_2d(sfa.data_ptr(), torch.float32, k_blocks, rows, mn_major_row_stride(sfa), 1, c.block_m, 0)
        # The last M-block's A and sfa boxes (dense only: other kinds pass the main descriptors, never read).
        a_last_desc, sfa_last_desc = a_desc, sfa_desc
        if self.spec.kind == GemmKind.DENSE:
            last_rows = dense_last_box_rows(c.block_m, rows)
            if last_rows != c.block_m:
                a_last_desc = encode_2d(a.data_ptr(), fp8, rows, k, a_stride, last_rows, c.block_k, 128)
                sfa_last_desc = encode_2d(sfa.data_ptr(), torch.float32, k_blocks, rows, mn_major_row_stride(sfa), 1,
                                          last_rows, 0)
        b_desc = encode_2d(b.data_ptr(), fp8, g.groups * n, k, b_stride, c.block_n // c.cluster_m, c.block_k, 128)
        b_last_rows = last_box_rows_b(self.spec)
        b_last_desc = b_desc
        if b_last_rows != c.block_n:
            b_last_desc = encode_2d(b.data_ptr(), fp8, g.groups * n, k, b_stride, b_last_rows, c.block_k, 128)
        return PackedArgs(
            [
                a_desc,
                b_desc,
                sfa_desc,
                a_last_desc,
                sfa_last_desc,
                b_last_desc,
                output_descriptors,
                U64(sfb.data_ptr()),
                U32(rows),
                U64(grouping.data_ptr() if grouping is not None else 0),
                U32(g.groups),
                U32(g.max_m),
                U64(0),  # split-tail workspace and counters: set per launch (launch_packed)
                U64(0),
            ]
        )

    def packed_args(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                    d: torch.Tensor, grouping: torch.Tensor | None = None) -> PackedArgs:
        """Kernel arguments (TMA descriptors + scalars) for these tensors, packed once per pointer set."""
        key = (a.data_ptr(), a.stride(-2), sfa.data_ptr(), sfa.stride(-1), sfa.stride(0), b.data_ptr(), b.stride(-2),
               sfb.data_ptr(), d.data_ptr(), d.stride(-2), grouping.data_ptr() if grouping is not None else 0)
        args = self._args.get(key)
        if args is None:
            if len(self._args) >= self._ARGS_CAPACITY:
                self._args.clear()
            args = self._args[key] = self._pack(a, sfa, b, sfb, d, grouping)
        return args

    def launch_packed(self, args: PackedArgs) -> None:
        stream = current_raw_stream(self.device_index)
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self.kernel.launch_config(
                self.device_index, stream, self.grid, self.block, self.spec.config.cluster_m)
        if self._split_ranges > 1:
            args = self._with_split_scratch(args, stream)
        launch_on_device(self.kernel, self.device_index, stream, config, args.address)

    _SPLIT_ARGS_CAPACITY = 8

    def _with_split_scratch(self, args: PackedArgs, stream: int) -> PackedArgs:
        """`args` with the FP32 partials and arrival counters of a split launch on `stream` (split_scratch: per
        stream and reused, since the kernel leaves the counters at zero; under graph capture, counters of the
        launch's own). A warm eager launch reuses its last pointers while the scratch generation holds."""
        capturing = stream_capturing(self.device_index)
        if not capturing:
            cached = self._split_args.get(stream)
            if cached is not None and cached[0] == split_scratch.generation and cached[1] is args:
                return cached[2]
        generation = split_scratch.generation
        workspace, counters = self.split_buffers(stream)
        derived = args.with_pointers(self._WORKSPACE_ARG, workspace.data_ptr(), self._COUNTERS_ARG, counters.data_ptr())
        if not capturing and split_scratch.generation == generation:  # nothing moved while get() ran
            if len(self._split_args) >= self._SPLIT_ARGS_CAPACITY:
                self._split_args.clear()
            self._split_args[stream] = (generation, args, derived, workspace, counters)
        return derived

    _WORKSPACE_ARG = 12  # positions of the split-tail pointers in _pack's argument list
    _COUNTERS_ARG = 13

    def split_count(self) -> int:
        """K ranges per tail tile for this plan's M (stream tail: 2, a head and an end; 1: no split); mirrors
        SplitTailTileScheduler and StreamTailTileScheduler."""
        c = self.spec.config
        if not (c.split_tail or c.stream_tail):
            return 1
        tiles = ceil_div(self.geometry.rows, c.block_m) * ceil_div(self.spec.n, c.block_n)
        if c.stream_tail:
            return stream_tail_pieces(tiles, self.grid, ceil_div(self.spec.k, 128))
        return split_tail_ranges(tiles, self.grid, ceil_div(self.spec.k, 128))

    def split_buffers(self, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Workspace (a block_m x block_n FP32 slot per split unit, stream tail: per tail tile; at most one
        per CTA either way) and zeroed counters for a launch on `stream`."""
        c = self.spec.config
        return split_scratch.get(self.device_index, stream, self.grid * c.block_m * c.block_n,
                                 self.grid * c.num_math_warpgroups)

    def launch(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
               grouping: torch.Tensor | None = None) -> None:
        """Launch on the current stream; `sfa` must already be M-major and TMA-aligned, `sfb` contiguous."""
        self.launch_packed(self.packed_args(a, sfa, b, sfb, d, grouping))


_plans: dict[tuple[int, int, int, int, torch.dtype, GemmConfig | None], Fp8GemmPlan] = {}
_plans_lock = threading.Lock()
_PLANS_CAPACITY = 512  # plans are cheap to rebuild (compiled kernels stay loaded): bound host memory


def get_plan(device_index: int, m: int, n: int, k: int, out_dtype: torch.dtype,
             config: GemmConfig | None = None) -> Fp8GemmPlan:
    """The plan for a shape; `config` overrides the heuristic's choice (used by the tuner)."""
    key = (device_index, m, n, k, out_dtype, config)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    if config is None:
        if os.environ.get("DEEPGEMM_AUTOTUNE") == "1":
            _autotune_if_missing(device_index, m, n, k, out_dtype)
        spec = plan_spec(m, n, k, out_dtype, sm_count(device_index), device_name(device_index))
    else:
        spec = Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config)
    if os.environ.get("DEEPGEMM_PRINT_CONFIGS"):
        print(f"deepgemm: m={m} {spec.label()}", file=sys.stderr)
    kernel = load_kernel(render_source(spec), spec.config.smem_bytes)
    with _plans_lock, torch.cuda.device(device_index):  # occupancy queries use the current context
        if len(_plans) >= _PLANS_CAPACITY:
            _plans.clear()
        plan = _plans.setdefault(key, Fp8GemmPlan(device_index, Geometry(rows=m), spec, kernel))
    return plan


def _autotune_if_missing(device_index: int, m: int, n: int, k: int, out_dtype: torch.dtype) -> None:
    """DEEPGEMM_AUTOTUNE=1: measure this shape's M bucket once (then it is read from the tuning file)."""
    from deepgemm.configs.tuner import tune_fp8_gemm_nt
    from deepgemm.configs.tuning_db import tuning_db

    out_elem_bytes = 4 if out_dtype == torch.float32 else 2
    if tuning_db(device_name(device_index)).lookup(m, n, k, sm_count(device_index), out_elem_bytes) is None:
        tune_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, device=device_index)


_grouped_plans: dict[tuple, Fp8GemmPlan] = {}


def get_grouped_plan(device_index: int, kind: GemmKind, geometry: Geometry, n: int, k: int, out_dtype: torch.dtype,
                     work_m: int) -> Fp8GemmPlan:
    """Plan for a grouped GEMM. `work_m` sizes the config: rows per group times groups for contiguous
    (all of A), expected rows per group for masked (its tile count is then work_m/bm x groups x N-blocks)."""
    key = (device_index, kind, geometry, n, k, out_dtype, work_m)
    plan = _grouped_plans.get(key)
    if plan is not None:
        return plan
    sms = sm_count(device_index)
    if kind == GemmKind.GROUPED_MASKED:
        block_m, block_n = masked_tile(work_m, geometry.groups, n, k, sms, 4 if out_dtype == torch.float32 else 2)
        config = make_config(max(work_m, 1), n, k, block_m, block_n, sms, 4 if out_dtype == torch.float32 else 2, cluster_m=1)
    else:
        block_m, block_n = contiguous_tile(work_m, geometry.groups, n, k, sms, 4 if out_dtype == torch.float32 else 2)
        config = make_config(max(work_m, 1), n, k, block_m, block_n, sms, 4 if out_dtype == torch.float32 else 2, cluster_m=1)
    spec = Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config, kind=kind)
    if os.environ.get("DEEPGEMM_PRINT_CONFIGS"):
        print(f"deepgemm: {geometry} {spec.label()}", file=sys.stderr)
    kernel = load_kernel(render_source(spec), spec.config.smem_bytes)
    with _plans_lock, torch.cuda.device(device_index):
        if len(_grouped_plans) >= _PLANS_CAPACITY:
            _grouped_plans.clear()
        plan = _grouped_plans.setdefault(key, Fp8GemmPlan(device_index, geometry, spec, kernel))
    return plan


