"""FP8 linear forward: x quantized per 1x128 group by the one-pass kernel, then the FP8 GEMM against a weight in
e4m3 with 128x128 block scales (what Fp8Linear and the tensor-parallel layers run per call).

A warm eager call takes a launch-ready path: the argument set (pointers, shapes, strides, dtypes, SM count) went
through the checked path before, so the call allocates the output only, and issues both launches with arguments
packed once per pointer set (in a steady state the caching allocator hands out the same blocks). The quantized x
and its scales, read by the GEMM alone, live in one temporary block: up to SCRATCH_MAX_BYTES (decode sizes, where
host time shows) a block kept per (device, stream) and reused in that stream's order; larger, or while the stream
is captured into a CUDA graph (whose replays may overlap eager work), a new allocation per call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from deepgemm.api import gemm as gemm_api
from deepgemm.api import quant as quant_api
from deepgemm.api.backend import backend_for
from deepgemm.jit.args import PackedArgs
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device, stream_capturing
from deepgemm.kernels.quantize_fp8.launch import token_group_launch
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Fp8GemmPlan
from deepgemm.utils import align_up, ceil_div

GROUP = 128  # activation scales per 1x128 group: the FP8 GEMM's K granule
FP8 = torch.float8_e4m3fn
_CAPACITY = 1024  # argument sets remembered; a full table is dropped (entries are cheap to rebuild)
_LAUNCHES_CAPACITY = 16  # pointer sets per argument set (a steady state has one or two; each capture adds one)
_grad_enabled = torch.is_grad_enabled
SCRATCH_MAX_BYTES = 8 << 20
_SCRATCH_STREAMS = 8  # scratch blocks kept per device, least recently used dropped first
_scratch: dict[int, OrderedDict[int, torch.Tensor]] = {}  # device index -> stream -> block
# Held from taking a scratch block through both launches: two threads on one stream (every thread starts on the
# default stream) would otherwise interleave quantize, quantize, GEMM, GEMM and read each other's temporaries.
_scratch_lock = threading.Lock()


def _scratch_block(device: torch.device, device_index: int, stream: int, nbytes: int) -> torch.Tensor:
    """At least `nbytes` for launches on `stream` (the current stream of the device), under _scratch_lock:
    launches there run in order, so the next call's quantization writes it only after this call's GEMM has read
    it. A dropped block goes back to torch's caching allocator, which reuses it in that stream's order."""
    blocks = _scratch.get(device_index)
    if blocks is None:
        blocks = _scratch[device_index] = OrderedDict()
    block = blocks.get(stream)
    if block is None or block.numel() < nbytes:
        if block is None and len(blocks) >= _SCRATCH_STREAMS:
            blocks.popitem(last=False)
        block = blocks[stream] = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8, device=device)
    blocks.move_to_end(stream)
    return block


def clear_scratch() -> None:
    """Drop every scratch block (their memory returns to torch's caching allocator; a later call makes new ones)."""
    with _scratch_lock:
        _scratch.clear()


@dataclass
class _Ready:
    """Launch state of one argument set: the sizes to allocate and the packed launches per pointer set."""

    device: torch.device
    device_index: int
    m: int
    k: int
    n: int
    out_cols: int  # the output's row length in elements (n, or n padded to 16 bytes)
    out_like: torch.Tensor  # an empty tensor of the output's dtype and device (gemm_api.empty_rows_like)
    sf_offset: int  # bytes from the temporary block's start to the scales (the quantized x comes first)
    temp_bytes: int
    plan: Fp8GemmPlan
    launches: dict[tuple[int, int, int], tuple[LoadedKernel, Any, PackedArgs, PackedArgs]] = field(
        default_factory=dict)

    def run(self, x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        """The two launches for these tensors (whose metadata keyed this entry; no tensor is held here, so a
        model's weights are freed with it)."""
        stream = current_raw_stream(self.device_index)
        if self.temp_bytes <= SCRATCH_MAX_BYTES and not stream_capturing(self.device_index):
            with _scratch_lock:
                temp = _scratch_block(self.device, self.device_index, stream, self.temp_bytes)
                return self._launch(x, weight, scale_inv, temp, stream)
        # A block of its own: the graph's pool while capturing (a replay may overlap eager work on other streams).
        return self._launch(x, weight, scale_inv, torch.empty(self.temp_bytes, dtype=torch.uint8, device=self.device),
                            stream)

    def _launch(self, x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, temp: torch.Tensor,
                stream: int) -> torch.Tensor:
        out = gemm_api.empty_rows_like(self.out_like, self.m, self.out_cols, self.n)
        key = (stream, temp.data_ptr(), out.data_ptr())
        launch = self.launches.get(key)
        if launch is None:
            launch = self._pack(x, weight, scale_inv, temp, out, stream, key)
        launch_on_device(launch[0], self.device_index, stream, launch[1], launch[2].address)
        self.plan.launch_packed(launch[3], stream)
        return out

    def _pack(self, x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, temp: torch.Tensor,
              out: torch.Tensor, stream: int,
              key: tuple[int, int, int]) -> tuple[LoadedKernel, Any, PackedArgs, PackedArgs]:
        q, sf = temp_views(temp, self.m, self.k, self.sf_offset)
        kernel, config, quant_args = token_group_launch(x, q, sf, GROUP, self.device_index, stream)
        gemm_args = self.plan.packed_args(q, sf, weight, scale_inv, out)
        if len(self.launches) >= _LAUNCHES_CAPACITY:
            self.launches.clear()
        launch = self.launches[key] = (kernel, config, quant_args, gemm_args)
        return launch


def temp_layout(m: int, k: int) -> tuple[int, int]:
    """(scales' byte offset, total bytes) of the temporary block: q e4m3 [M, K] row-major, then the scales
    [ceil(K/128), align(M, 4)] float32 (the M-major layout quantize_per_token_group returns), 16-byte aligned."""
    sf_offset = align_up(m * k, 16)
    return sf_offset, sf_offset + ceil_div(k, GROUP) * align_up(m, 4) * 4


def temp_views(temp: torch.Tensor, m: int, k: int, sf_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [M, K] and sf [M, ceil(K/128)] (strides (1, align(M, 4))) over the temporary block."""
    groups, rows = ceil_div(k, GROUP), align_up(m, 4)
    q = temp[:m * k].view(FP8).view(m, k)
    sf = temp[sf_offset:sf_offset + groups * rows * 4].view(torch.float32).view(groups, rows)[:, :m].t()
    return q, sf


_ready: dict[tuple, _Ready] = {}


def _key(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype,
         num_sms: int | None) -> tuple:
    # As the GEMM's key: data pointers pin each tensor's device (unified addressing), so no device is read.
    return (x.data_ptr(), x.shape, x.stride(), x.dtype, weight.data_ptr(), weight.shape, weight.stride(),
            weight.dtype, scale_inv.data_ptr(), scale_inv.shape, scale_inv.stride(), scale_inv.dtype, out_dtype,
            num_sms)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
               out_dtype: torch.dtype | None = torch.bfloat16, num_sms: int | None = None) -> torch.Tensor:
    """y [M, N] = quantize_per_token_group(x) @ (weight * scale_inv)^T, FP32 accumulation, `out_dtype` out.

    x: float32/bfloat16/float16 [M, K]; weight: e4m3 [N, K]; scale_inv: float32 [ceil(N/128), ceil(K/128)];
    out_dtype: bfloat16 (also for None) or float32; num_sms: as fp8_gemm_nt's. The same results, rules and errors
    as quantize_per_token_group followed by fp8_gemm_nt (which the first call of an argument set runs, on every
    backend).
    """
    if out_dtype is None:
        out_dtype = torch.bfloat16
    ready = None
    if num_sms is None or type(num_sms) is int:  # (True and 66.0 key as 1 and 66: they take the checked path)
        try:
            ready = _ready.get(_key(x, weight, scale_inv, out_dtype, num_sms))
        except (AttributeError, TypeError):
            pass
    if ready is not None and not (_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                       or scale_inv.requires_grad)):
        return ready.run(x, weight, scale_inv)
    return _checked(x, weight, scale_inv, out_dtype, num_sms)


def _checked(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype,
             num_sms: int | None) -> torch.Tensor:
    """The public functions' path (every check), remembering the launch state when both kernels ran on our GPU
    path on the caller's own tensors."""
    q, sf = quant_api.quantize_per_token_group(x, GROUP)
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and out_dtype in gemm_api.OUT_DTYPES):
        # (raises the typed error)
        return gemm_api.fp8_gemm_nt((q, sf), (weight, scale_inv), out_dtype=out_dtype, num_sms=num_sms)
    out = gemm_api.allocate_out(q.shape[0], weight.shape[0], out_dtype, q.device)
    gemm_api.fp8_gemm_nt((q, sf), (weight, scale_inv), out, num_sms=num_sms)
    if num_sms is None or type(num_sms) is int:
        _remember(x, q, sf, weight, scale_inv, out, num_sms)
    return out


def _remember(x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
              out: torch.Tensor, num_sms: int | None) -> None:
    m, k = x.shape
    if m == 0 or k == 0 or (k > 1 and x.stride(1) != 1) or backend_for(x) != "sm90":
        return  # nothing launched, x copied first, or the reference path
    plan = gemm_api.ready_plan(q, sf, weight, scale_inv, out, num_sms)
    if plan is None:
        return  # the GEMM needed a layout copy of the weight's scales: not launch-ready
    n = weight.shape[0]
    sf_offset, temp_bytes = temp_layout(m, k)
    if len(_ready) >= _CAPACITY:
        _ready.clear()
    _ready[_key(x, weight, scale_inv, out.dtype, num_sms)] = _Ready(
        device=x.device, device_index=x.device.index, m=m, k=k, n=n, out_cols=out.stride(0), out_like=out.new_empty(0),
        sf_offset=sf_offset, temp_bytes=temp_bytes, plan=plan)
