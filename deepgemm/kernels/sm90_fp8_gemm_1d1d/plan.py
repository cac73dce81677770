"""Launch plans of the k-grouped FP8 GEMM (1D1D): kernel, persistent grid, packed arguments per pointer set."""

from __future__ import annotations

import threading

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.jit.tma import encode_2d
from deepgemm.kernels.common.device import sm_count
from deepgemm.kernels.common.layout import mn_major_row_stride, tma_row_stride
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.kernels.common.output import NO_OUTPUT_DESCRIPTORS, output_descriptors_3d
from deepgemm.kernels.sm90_fp8_gemm_1d1d.spec import BLOCK_K, BLOCK_M, THREADS, KGroupedSpec, render_source
from deepgemm.utils import ceil_div


class KGroupedPlan:
    """Launch state for one (device, M, N, C in place or not): kernel, persistent grid, packed arguments per pointer
    set."""

    _ARGS_CAPACITY = 256

    def __init__(self, device_index: int, spec: KGroupedSpec, kernel: LoadedKernel) -> None:
        self.device_index = device_index
        self.spec = spec
        self.kernel = kernel
        self.tiles_per_group = ceil_div(spec.m, BLOCK_M) * ceil_div(spec.n, spec.block_n)
        self.num_sms = sm_count(device_index)
        self._args: dict[tuple[int, ...], PackedArgs] = {}

    def _pack(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, k_offsets: torch.Tensor,
              groups: int, d: torch.Tensor, c: torch.Tensor | None) -> PackedArgs:
        m, n, bn = self.spec.m, self.spec.n, self.spec.block_n
        k_total = a.shape[1]
        fp8 = torch.float8_e4m3fn
        return PackedArgs([
            encode_2d(a.data_ptr(), fp8, m, k_total, tma_row_stride(a), BLOCK_M, BLOCK_K, 128),
            encode_2d(b.data_ptr(), fp8, n, k_total, tma_row_stride(b), bn, BLOCK_K, 128),
            encode_2d(sfa.data_ptr(), torch.float32, k_total // BLOCK_K, m, mn_major_row_stride(sfa), 1, BLOCK_M, 0),
            encode_2d(sfb.data_ptr(), torch.float32, k_total // BLOCK_K, n, mn_major_row_stride(sfb), 1, bn, 0),
            output_descriptors_3d(d) if self.spec.store_n else NO_OUTPUT_DESCRIPTORS,
            U64(k_offsets.data_ptr()),
            U32(groups),
            U64(d.data_ptr()),
            U64(c.data_ptr() if c is not None else 0),
        ])

    def launch(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, k_offsets: torch.Tensor,
               groups: int, d: torch.Tensor, c: torch.Tensor | None) -> None:
        """`sfa`/`sfb` M-major and TMA-aligned, `k_offsets` int32 [groups + 1] on the device, d/c contiguous; an
        in-place plan (spec.c_in_place) adds into `d` and takes no `c`."""
        if c is not None and self.spec.c_in_place:
            raise ValueError("an in-place k-grouped plan adds into d: pass c=None")
        key = (a.data_ptr(), a.stride(0), a.shape[1], sfa.data_ptr(), sfa.stride(-1), b.data_ptr(), b.stride(0),
               sfb.data_ptr(), sfb.stride(-1), k_offsets.data_ptr(), groups, d.data_ptr(),
               c.data_ptr() if c is not None else 0)
        args = self._args.get(key)
        if args is None:
            if len(self._args) >= self._ARGS_CAPACITY:
                self._args.clear()
            args = self._args[key] = self._pack(a, sfa, b, sfb, k_offsets, groups, d, c)
        grid = max(1, min(self.num_sms, groups * self.tiles_per_group))
        stream = current_raw_stream(self.device_index)
        config = self.kernel.launch_config(self.device_index, stream, grid, THREADS)  # cached per stream and grid
        launch_on_device(self.kernel, self.device_index, stream, config, args.address)


_plans: dict[tuple[int, int, int, bool, int | None, int | None, int | None], KGroupedPlan] = {}
_plans_lock = threading.Lock()


def get_kgrouped_plan(device_index: int, m: int, n: int, c_in_place: bool = False, store_n: int | None = None,
                      group_rows: int | None = None, block_n: int | None = None) -> KGroupedPlan:
    """The plan of an M x N k-grouped GEMM; c_in_place: C is the output itself (TMA reduce-add stores, N % 4 == 0);
    store_n, group_rows, block_n: the epilogue's chunk, the raster band and the tile width (None: the shape's
    defaults, KGroupedSpec.for_shape; probes pass others)."""
    key = (device_index, m, n, c_in_place, store_n, group_rows, block_n)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    spec = KGroupedSpec.for_shape(m, n, c_in_place, store_n, group_rows, block_n)
    kernel = load_kernel(render_source(spec), spec.smem_bytes, device_index)
    with _plans_lock:
        if len(_plans) >= 512:
            _plans.clear()
        plan = _plans.setdefault(key, KGroupedPlan(device_index, spec, kernel))
    return plan
