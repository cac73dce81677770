"""Launch plans of the BF16 GEMM: a loaded kernel, its persistent grid, and packed arguments per pointer set."""

from __future__ import annotations

import threading

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.jit.tma import encode_2d
from deepgemm.kernels.common.device import sm_count
from deepgemm.kernels.common.hopper import elem_bytes
from deepgemm.kernels.common.layout import tma_row_stride
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.kernels.common.output import output_descriptors
from deepgemm.kernels.sm90_bf16_gemm.config import ATOM, BLOCK_K, Bf16GemmConfig
from deepgemm.kernels.sm90_bf16_gemm.cost_model import Bf16Problem, choose_config
from deepgemm.kernels.sm90_bf16_gemm.spec import Bf16GemmSpec, a_mn_major, addend_kind, b_mn_major, render_source
from deepgemm.utils import ceil_div

BF16 = torch.bfloat16


def operand_descriptor(t: torch.Tensor, mn_major: bool, block_rows: int) -> bytes:
    """TMA descriptor of one operand as stored: K-major [MN, K] in boxes [block_rows, 64 K], or MN-major [K, MN] in
    64 x 64 atoms (both 128B-swizzled, as the kernel's descriptors expect)."""
    rows, cols = t.shape
    if mn_major:
        return encode_2d(t.data_ptr(), BF16, rows, cols, tma_row_stride(t), BLOCK_K, ATOM, 128)
    return encode_2d(t.data_ptr(), BF16, rows, cols, tma_row_stride(t), block_rows, BLOCK_K, 128)


class Bf16GemmPlan:
    """Launch state for one (device, M, N, K, layout, out dtype, addend kind, config)."""

    _ARGS_CAPACITY = 1024

    def __init__(self, device_index: int, m: int, spec: Bf16GemmSpec, kernel: LoadedKernel) -> None:
        c = spec.config
        self.device_index = device_index
        self.m = m
        self.spec = spec
        self.kernel = kernel
        tiles = ceil_div(m, c.block_m) * ceil_div(spec.n, c.block_n)
        self.grid = max(1, min(c.num_sms, tiles))
        self.block = c.num_threads
        self._args: dict[tuple, PackedArgs] = {}
        self._configs: dict[int, object] = {}

    def packed_args(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> PackedArgs:
        key = (a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(0), d.data_ptr(), d.stride(0),
               c.data_ptr() if c is not None else 0, c.stride(0) if c is not None else 0)
        args = self._args.get(key)
        if args is None:
            if len(self._args) >= self._ARGS_CAPACITY:
                self._args.clear()
            layout, config = self.spec.layout, self.spec.config
            args = self._args[key] = PackedArgs([
                operand_descriptor(a, a_mn_major(layout), config.block_m),
                operand_descriptor(b, b_mn_major(layout), config.block_n),
                output_descriptors(d, self.m, self.spec.n, tma_row_stride(d)),
                U32(self.m),
                U64(c.data_ptr() if c is not None else 0),
                U32(tma_row_stride(c) if c is not None else 0),
            ])
        return args

    def launch_packed(self, args: PackedArgs) -> None:
        stream = current_raw_stream(self.device_index)
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self.kernel.launch_config(self.device_index, stream, self.grid, self.block)
        launch_on_device(self.kernel, self.device_index, stream, config, args.address)

    def launch(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
        self.launch_packed(self.packed_args(a, b, d, c))


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
        return _plans.setdefault(key, Bf16GemmPlan(device_index, m, spec, kernel))
