"""Launch plans of the FP8 1D2D GEMM: a loaded kernel, its grid, and packed arguments per pointer set."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.jit.tma import encode_2d, encode_3d
from deepgemm.kernels.common.device import sm_count
from deepgemm.kernels.common.grid import balanced_grid
from deepgemm.kernels.common.layout import dense_last_box_rows, masked_sfa_strides, mn_major_row_stride, tma_row_stride
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.kernels.common.output import output_descriptors
from deepgemm.kernels.common.split_scratch import SplitLaunchArgs, split_scratch
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind, GemmProblem
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import split_tail_ranges, stream_tail_pieces
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, a_box_rows, last_box_rows_b, render_source
from deepgemm.env import env_flag
from deepgemm.utils import ceil_div


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
        resident = c.num_sms // c.cluster_size
        if c.cluster_size > 1:
            # A persistent grid must be fully resident: some SMs may have no cluster partner.
            resident = min(resident, kernel.max_active_clusters(device_index, c.num_threads, c.cluster_size))
        if geometry.tiles_known and not (c.split_tail or c.stream_tail):
            # (A split-tail grid keeps every SM: fewer tiles than SMs are then split along K.)
            cluster_tiles = (ceil_div(ceil_div(geometry.rows, c.block_m), c.cluster_m)
                             * ceil_div(spec.n, c.block_n * c.cluster_n))
            resident = min(resident, cluster_tiles)
            if resident > 0 and spec.kind == GemmKind.DENSE and c.balanced_grid:
                resident = balanced_grid(cluster_tiles, resident)  # every CTA the same number of tiles
        self.grid = max(resident, 1) * c.cluster_size
        self.block = c.num_threads
        self._args: dict[tuple[int, ...], PackedArgs] = {}
        self._configs: dict[int, object] = {}  # launch config per stream
        self._split_args = SplitLaunchArgs(device_index, self._WORKSPACE_ARG, self._COUNTERS_ARG)
        if (c.split_tail or c.stream_tail) and (spec.kind != GemmKind.DENSE or c.cluster_size != 1):
            raise ValueError(f"split_tail and stream_tail need a dense GEMM without clusters, got {spec.label()}")
        if c.cluster_n != 1 and (spec.kind != GemmKind.DENSE or ceil_div(spec.n, c.block_n) % c.cluster_n):
            raise ValueError(f"cluster_n = {c.cluster_n} needs a dense GEMM with an even number of N-blocks, got "
                             f"{spec.label()}")
        # K ranges per tail tile, fixed per plan (dense plans have a fixed M): launches only test it.
        self._split_ranges = self.split_count()

    def _pack(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
              grouping: torch.Tensor | None) -> PackedArgs:
        c, g, n, k = self.spec.config, self.geometry, self.spec.n, self.spec.k
        rows = g.rows
        k_blocks = ceil_div(k, 128)
        fp8 = torch.float8_e4m3fn
        d_descriptors = output_descriptors(d, rows, n, d.stride(-2) if d.dim() == 3 else tma_row_stride(d))
        a_stride = a.stride(-2) if a.dim() == 3 else tma_row_stride(a)
        b_stride = b.stride(-2) if b.dim() == 3 else tma_row_stride(b)
        a_rows_per_box = a_box_rows(self.spec.kind, c.block_m) // c.cluster_n  # A multicast: each CTA loads half
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
                d_descriptors,
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

    def launch_packed(self, args: PackedArgs, stream: int | None = None) -> None:
        """Launch on `stream` (None: the device's current stream, which a caller that has it may pass)."""
        if stream is None:
            stream = current_raw_stream(self.device_index)
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self.kernel.launch_config(
                self.device_index, stream, self.grid, self.block, self.spec.config.cluster_size)
        if self._split_ranges > 1:
            # The FP32 partials and zeroed counters of a split launch (split_scratch: per stream and reused, since
            # the kernel leaves the counters at zero; under graph capture, counters of the launch's own).
            args = self._split_args.derive(args, stream, self.split_buffers)
        launch_on_device(self.kernel, self.device_index, stream, config, args.address)

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


_plans: dict[tuple, Fp8GemmPlan] = {}
_grouped_plans: dict[tuple, Fp8GemmPlan] = {}
_plans_lock = threading.Lock()
_PLANS_CAPACITY = 512  # per table; plans are cheap to rebuild (compiled kernels stay loaded): bound host memory


def get_plan(device_index: int, m: int, n: int, k: int, out_dtype: torch.dtype,
             config: GemmConfig | None = None, num_sms: int | None = None) -> Fp8GemmPlan:
    """The plan for a dense shape: `config` (a tuned or experimental choice) or the heuristic's for `num_sms` SMs
    (None: the device's, under the DEEPGEMM_NUM_SMS cap). The grid never exceeds the config's num_sms, so a given
    `config` must be planned for `num_sms` when both are given."""
    key = (device_index, m, n, k, out_dtype, config, num_sms)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    if config is None:
        config = choose_config(GemmProblem(m, n, k, sm_count(device_index) if num_sms is None else num_sms, out_dtype))
    elif num_sms is not None and config.num_sms != num_sms:
        raise ValueError(f"get_plan: 'config' is planned for {config.num_sms} SMs but 'num_sms' is {num_sms}")
    spec = Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config)
    return _build(_plans, key, device_index, Geometry(rows=m), spec, f"m={m}")


def get_grouped_plan(device_index: int, kind: GemmKind, geometry: Geometry, n: int, k: int, out_dtype: torch.dtype,
                     config_m: int, config: GemmConfig | None = None) -> Fp8GemmPlan:
    """Plan for a grouped GEMM. `config_m` sizes the heuristic's config: all rows of A for contiguous, the expected
    rows per group for masked (its tile count is then about config_m/bm x groups x N-blocks)."""
    key = (device_index, kind, geometry, n, k, out_dtype, config_m, config)
    plan = _grouped_plans.get(key)
    if plan is not None:
        return plan
    spec = grouped_spec(kind, geometry, n, k, out_dtype, config_m, sm_count(device_index), config)
    return _build(_grouped_plans, key, device_index, geometry, spec, str(geometry))


def grouped_spec(kind: GemmKind, geometry: Geometry, n: int, k: int, out_dtype: torch.dtype, config_m: int,
                 num_sms: int, config: GemmConfig | None = None) -> Fp8GemmSpec:
    """The instantiation get_grouped_plan builds for `num_sms` SMs: `config`, else the grouped heuristics' choice.
    Needs no device, so precompiling plans exactly the kernel a launch will load."""
    if config is None:
        config = choose_config(GemmProblem(config_m, n, k, num_sms, out_dtype, kind, geometry.groups, geometry.max_m))
    return Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config, kind=kind)


def _build(table: dict[tuple, Fp8GemmPlan], key: tuple, device_index: int, geometry: Geometry, spec: Fp8GemmSpec,
           what: str) -> Fp8GemmPlan:
    if env_flag("DEEPGEMM_PRINT_CONFIGS"):
        print(f"deepgemm: {what} {spec.label()}", file=sys.stderr)
    kernel = load_kernel(render_source(spec), spec.config.smem_bytes, device_index)
    with _plans_lock, torch.cuda.device(device_index):  # occupancy queries use the current context
        if len(table) >= _PLANS_CAPACITY:
            table.clear()
        return table.setdefault(key, Fp8GemmPlan(device_index, geometry, spec, kernel))


def clear_plans() -> None:
    """Forget every dense and grouped plan (tools that swap tile choices; loaded kernels stay loaded)."""
    with _plans_lock:
        _plans.clear()
        _grouped_plans.clear()
