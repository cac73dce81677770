"""Launch plans of the BF16 GEMM (dense and grouped kinds): a loaded kernel, its persistent grid, and packed
arguments per pointer set."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.jit.tma import encode_2d
from deepgemm.kernels.common.device import sm_count
from deepgemm.kernels.common.grid import balanced_grid
from deepgemm.kernels.common.hopper import elem_bytes
from deepgemm.kernels.common.layout import dense_last_box_rows, tma_row_stride
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.common.output import output_descriptors, output_descriptors_3d
from deepgemm.kernels.common.split_scratch import SplitLaunchArgs, split_scratch, split_tail_ranges
from deepgemm.kernels.sm90_bf16_gemm.config import ATOM, BLOCK_K, Bf16GemmConfig
from deepgemm.kernels.sm90_bf16_gemm.cost_model import Bf16Problem, choose_config
from deepgemm.kernels.sm90_bf16_gemm.spec import Bf16GemmSpec, a_mn_major, addend_kind, b_mn_major, render_source
from deepgemm.utils import ceil_div

BF16 = torch.bfloat16
# Tokens per group the k-grouped tile is chosen for: ks changes every training step, the kernel must not.
K_GROUPED_NOMINAL_K = 4096


@dataclass(frozen=True)
class Bf16Geometry:
    """The run-time extent of a launch: rows of A and D as the kernel indexes them (dense: M; contiguous: M_total;
    masked: G * max_m; k-grouped: M), the groups, and max_m (masked)."""

    rows: int
    groups: int = 1
    max_m: int = 0


def operand_descriptor(t: torch.Tensor, mn_major: bool, block_rows: int) -> bytes:
    """TMA descriptor of one operand as stored: K-major [MN, K] in boxes [block_rows, 64 K], or MN-major [K, MN] in
    64 x 64 atoms (both 128B-swizzled, as the kernel's descriptors expect)."""
    rows, cols = t.shape
    if mn_major:
        return encode_2d(t.data_ptr(), BF16, rows, cols, tma_row_stride(t), BLOCK_K, ATOM, 128)
    return encode_2d(t.data_ptr(), BF16, rows, cols, tma_row_stride(t), block_rows, BLOCK_K, 128)


class Bf16GemmPlan:
    """Launch state for one (device, geometry, N, K, layout, out dtype, addend kind, kind, config)."""

    _ARGS_CAPACITY = 1024

    def __init__(self, device_index: int, geometry: Bf16Geometry | int, spec: Bf16GemmSpec, kernel: LoadedKernel) -> None:
        c = spec.config
        self.device_index = device_index
        self.geometry = geometry if isinstance(geometry, Bf16Geometry) else Bf16Geometry(geometry)
        self.m = self.geometry.rows
        self.spec = spec
        self.kernel = kernel
        n_blocks = ceil_div(spec.n, c.block_n)
        if spec.kind == GemmKind.GROUPED_MASKED or c.split_k:
            tiles = c.num_sms  # masked: the counts live in device memory; split-K: idle SMs take K ranges
        elif spec.kind == GemmKind.K_GROUPED:
            tiles = self.geometry.groups * ceil_div(self.m, c.block_m) * n_blocks
        else:
            tiles = ceil_div(self.m, c.block_m) * n_blocks
        self.grid = max(1, min(c.num_sms, tiles))
        if c.balanced_grid and spec.kind == GemmKind.DENSE and not c.split_k:
            self.grid = balanced_grid(tiles, self.grid)  # every CTA the same number of tiles
        self.block = c.num_threads
        self._args: dict[tuple, PackedArgs] = {}
        self._configs: dict[int, object] = {}
        # K ranges per tile of the last wave (1: nothing splits), fixed per plan (dense plans have a fixed M).
        self.splits = split_tail_ranges(ceil_div(self.m, c.block_m) * n_blocks, self.grid,
                                        ceil_div(spec.k, BLOCK_K)) if c.split_k else 1
        self._split_args = SplitLaunchArgs(device_index, self._WORKSPACE_ARG, self._COUNTERS_ARG)

    _WORKSPACE_ARG = 10  # positions of the split-K pointers in _pack's argument list
    _COUNTERS_ARG = 11

    def packed_args(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None,
                    grouping: torch.Tensor | None = None) -> PackedArgs:
        """A, B, D as the API holds them (masked A/D [G, max_m, *], M-grouped B [G, N, K], k-grouped D and C
        [G, M, N]); grouping: m_indices, psum, masked_m or the k-grouped offsets."""
        # Shapes are part of the key: a k-grouped plan serves every K_total, which its descriptors hold.
        key = (a.data_ptr(), a.shape, a.stride(0), b.data_ptr(), b.shape, b.stride(0), d.data_ptr(), d.stride(0),
               c.data_ptr() if c is not None else 0, c.stride(0) if c is not None else 0,
               grouping.data_ptr() if grouping is not None else 0)
        args = self._args.get(key)
        if args is None:
            if len(self._args) >= self._ARGS_CAPACITY:
                self._args.clear()
            args = self._args[key] = self._pack(a, b, d, c, grouping)
        return args

    def _pack(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None,
              grouping: torch.Tensor | None) -> PackedArgs:
        layout, config, kind, g = self.spec.layout, self.spec.config, self.spec.kind, self.geometry
        if a.dim() == 3:
            a = a.flatten(0, 1)  # masked: [G * max_m, K] (stacked rows, checked by the API)
        if b.dim() == 3:
            b = b.flatten(0, 1)  # M-grouped: [G * N, K]
        if kind == GemmKind.K_GROUPED:
            d_desc = output_descriptors_3d(d)
            c_stride = self.spec.n if c is not None else 0
        else:
            d2 = d.flatten(0, 1) if d.dim() == 3 else d
            d_desc = output_descriptors(d2, self.m, self.spec.n, tma_row_stride(d2))
            c_stride = tma_row_stride(c) if c is not None else 0
        a_desc = operand_descriptor(a, a_mn_major(layout), config.block_m)
        # A dense K-major A's partial last M-block in a box of its rows (the kernel's kLastBoxA; others never read it).
        a_last_desc = a_desc
        if kind == GemmKind.DENSE and not a_mn_major(layout):
            last_rows = dense_last_box_rows(config.block_m, self.m)
            if last_rows != config.block_m:
                a_last_desc = operand_descriptor(a, False, last_rows)
        return PackedArgs([
            a_desc,
            a_last_desc,
            operand_descriptor(b, b_mn_major(layout), config.block_n),
            d_desc,
            U32(self.m),
            U64(grouping.data_ptr() if grouping is not None else 0),
            U32(g.groups),
            U32(g.max_m),
            U64(c.data_ptr() if c is not None else 0),
            U32(c_stride),
            U64(0),  # split-K workspace and counters: set per launch (launch_packed)
            U64(0),
        ])

    def launch_packed(self, args: PackedArgs) -> None:
        stream = current_raw_stream(self.device_index)
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self.kernel.launch_config(self.device_index, stream, self.grid, self.block)
        if self.splits > 1:
            args = self._split_args.derive(args, stream, self.split_buffers)
        launch_on_device(self.kernel, self.device_index, stream, config, args.address)

    def split_buffers(self, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split-K workspace (a block_m x block_n FP32 slot per split unit, at most one per CTA) and zeroed
        counters (one per tile and math warpgroup) for a launch on `stream`."""
        c = self.spec.config
        return split_scratch.get(self.device_index, stream, self.grid * c.block_m * c.block_n,
                                 self.grid * c.num_math_warpgroups)

    def launch(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
               grouping: torch.Tensor | None = None) -> None:
        self.launch_packed(self.packed_args(a, b, d, c, grouping))


def bf16_problem(m: int, n: int, k: int, layout: str, out_dtype: torch.dtype, c_dtype: torch.dtype | None,
                 num_sms: int) -> Bf16Problem:
    return Bf16Problem(m, n, k, a_mn_major(layout), b_mn_major(layout), elem_bytes(out_dtype),
                       0 if c_dtype is None else elem_bytes(c_dtype), num_sms)


def bf16_spec(m: int, n: int, k: int, layout: str, out_dtype: torch.dtype, c_dtype: torch.dtype | None, num_sms: int,
              config: Bf16GemmConfig | None = None) -> Bf16GemmSpec:
    """The instantiation a shape uses on `num_sms` SMs (`config`, else the cost model's); needs no device."""
    if config is None:
        config = choose_config(bf16_problem(m, n, k, layout, out_dtype, c_dtype, num_sms))
    return Bf16GemmSpec(n=n, k=k, layout=layout, out_dtype=out_dtype, addend=addend_kind(c_dtype), config=config)


def grouped_problem(kind: GemmKind, geometry: Bf16Geometry, n: int, k: int, out_dtype: torch.dtype,
                    c_dtype: torch.dtype | None, expected_m: int, num_sms: int) -> Bf16Problem:
    """The cost model's view of a grouped launch: `groups` GEMMs of (rows per expert) x N x K; masked rows per expert
    = expected_m, contiguous = M_total / G, k-grouped = M with K_GROUPED_NOMINAL_K tokens per group."""
    groups = max(1, geometry.groups)
    if kind == GemmKind.K_GROUPED:
        return Bf16Problem(geometry.rows, n, K_GROUPED_NOMINAL_K, True, True, 4,
                           0 if c_dtype is None else elem_bytes(c_dtype), num_sms, groups, k_grouped=True)
    rows = expected_m if kind == GemmKind.GROUPED_MASKED else ceil_div(geometry.rows, groups)
    return Bf16Problem(max(1, rows), n, k, False, False, elem_bytes(out_dtype), 0, num_sms, groups, m_grouped=True,
                       contiguous=kind == GemmKind.GROUPED_CONTIGUOUS)


def grouped_spec(kind: GemmKind, geometry: Bf16Geometry, n: int, k: int, out_dtype: torch.dtype,
                 c_dtype: torch.dtype | None, expected_m: int, num_sms: int, c_in_place: bool = False) -> Bf16GemmSpec:
    """The instantiation a grouped launch uses (k-grouped: k = 0, each group's K range is run-time; c_in_place: C
    is the FP32 output itself, added by the stores)."""
    config = choose_config(grouped_problem(kind, geometry, n, k, out_dtype, c_dtype, expected_m, num_sms))
    layout = "tn" if kind == GemmKind.K_GROUPED else "nt"
    return Bf16GemmSpec(n=n, k=0 if kind == GemmKind.K_GROUPED else k, layout=layout, out_dtype=out_dtype,
                        addend=addend_kind(c_dtype, c_in_place), config=config, kind=kind)


_plans: dict[tuple, Bf16GemmPlan] = {}
_plans_lock = threading.Lock()
_PLANS_CAPACITY = 512


def get_bf16_plan(device_index: int, m: int, n: int, k: int, layout: str, out_dtype: torch.dtype,
                  c_dtype: torch.dtype | None, config: Bf16GemmConfig | None = None) -> Bf16GemmPlan:
    key = (device_index, m, n, k, layout, out_dtype, c_dtype, config)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    spec = bf16_spec(m, n, k, layout, out_dtype, c_dtype, sm_count(device_index), config)
    kernel = load_kernel(render_source(spec), spec.smem_bytes, device_index)
    with _plans_lock, torch.cuda.device(device_index):
        if len(_plans) >= _PLANS_CAPACITY:
            _plans.clear()
        return _plans.setdefault(key, Bf16GemmPlan(device_index, Bf16Geometry(m), spec, kernel))


def get_bf16_grouped_plan(device_index: int, kind: GemmKind, geometry: Bf16Geometry, n: int, k: int,
                          out_dtype: torch.dtype, c_dtype: torch.dtype | None, expected_m: int,
                          c_in_place: bool = False) -> Bf16GemmPlan:
    """The plan of a grouped launch (expected_m: masked only; its bucket is part of the key; c_in_place: C is the
    FP32 output itself, and the launch passes no C)."""
    key = (device_index, kind, geometry, n, k, out_dtype, c_dtype, expected_m, c_in_place)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    spec = grouped_spec(kind, geometry, n, k, out_dtype, c_dtype, expected_m, sm_count(device_index), c_in_place)
    kernel = load_kernel(render_source(spec), spec.smem_bytes, device_index)
    with _plans_lock, torch.cuda.device(device_index):
        if len(_plans) >= _PLANS_CAPACITY:
            _plans.clear()
        return _plans.setdefault(key, Bf16GemmPlan(device_index, geometry, spec, kernel))
