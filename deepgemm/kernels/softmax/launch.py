"""GPU fused softmax (scale, causal mask) and its backward: the launch shape, instantiation and launch."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.compiler import KernelSource
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.kernels.common.elements import ELEMENT_KINDS, VECTOR_BYTES, vector_aligned, vector_elements
from deepgemm.kernels.common.device import physical_sm_count
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.utils import ceil_div, next_power_of_2

MAX_THREADS_PER_ROW = 1024
# Registers (32-bit words) of a row each thread keeps (the forward one row, the backward two): up to 8 16-byte
# vectors, 4 in a 1024-thread CTA (64 registers a thread: 8 spill there). A row group caches up to 32768 bf16 /
# 16384 fp32 values; longer rows stream.
CACHED_WORDS = 32
CACHED_WORDS_1024 = 16
MAX_ITEMS = 8            # vectors a thread loads per pass (unrolled)
ITEMS_PER_THREAD = 4     # the row group is sized for about this many vectors a thread
MIN_CTA_THREADS = 256
MAX_CLUSTER_CTAS = 8     # a longer row is split over a cluster of up to 8 CTAs (the portable cluster size)


@dataclass(frozen=True)
class SoftmaxShape:
    """How a row maps onto threads: `threads_per_row` threads (a power of two) of each of `cluster` CTAs (a cluster
    when > 1, one row per CTA) load `items` vectors of `vector` elements per pass; `streaming` rows are longer than
    one pass and are read twice."""

    threads_per_row: int
    items: int
    vector: int
    streaming: bool
    cluster: int = 1
    rows_in_flight: int = 1  # rows a row group loads before reducing the first (cached one-CTA rows; experiments)

    @property
    def cta_threads(self) -> int:
        return max(MIN_CTA_THREADS, self.threads_per_row)

    @property
    def rows_per_cta(self) -> int:
        return self.cta_threads // self.threads_per_row

    def grid(self, rows: int) -> int:
        """CTAs for `rows` rows."""
        return rows * self.cluster if self.cluster > 1 else ceil_div(rows, self.rows_per_cta * self.rows_in_flight)


def softmax_shape(n: int, dtype: torch.dtype, vectorized: bool, backward: bool = False, rows: int = 1,
                  num_sms: int = 132) -> SoftmaxShape:
    """The row group for `rows` rows of `n` elements: the fewest threads (up to 1024) that hold a row in about
    ITEMS_PER_THREAD vectors each, within the register budget. A longer row spans a cluster of 2, 4 or 8 such CTAs
    while the rows alone would leave SMs idle (rows < num_sms), and streams (read twice) otherwise or past 8 CTAs:
    with a CTA a row on every SM, the cluster's barriers cost more than the second read (1.4x on 512 x 128256 bf16,
    H200), while 16 rows of 262144 ran 2.5x faster on 8-CTA clusters than streamed."""
    vector = vector_elements(dtype) if vectorized else 1
    words = (4 if vectorized else 1) * (2 if backward else 1)
    vectors = ceil_div(n, vector)
    threads = min(MAX_THREADS_PER_ROW, next_power_of_2(ceil_div(vectors, ITEMS_PER_THREAD)))
    budget = CACHED_WORDS_1024 if threads == MAX_THREADS_PER_ROW else CACHED_WORDS
    max_items = min(MAX_ITEMS, max(1, budget // words))
    items = next_power_of_2(ceil_div(vectors, threads))
    if items <= max_items:
        return SoftmaxShape(threads, items, vector, False)
    items = min(MAX_ITEMS, max(1, CACHED_WORDS_1024 // words))
    streaming_items = min(ITEMS_PER_THREAD, items)
    if rows >= num_sms:
        return SoftmaxShape(MAX_THREADS_PER_ROW, streaming_items, vector, True)
    cluster = next_power_of_2(ceil_div(vectors, MAX_THREADS_PER_ROW * items))
    if cluster <= MAX_CLUSTER_CTAS:
        return SoftmaxShape(MAX_THREADS_PER_ROW, items, vector, False, cluster)
    return SoftmaxShape(MAX_THREADS_PER_ROW, streaming_items, vector, True, MAX_CLUSTER_CTAS)


def forward_source(dtype: torch.dtype, shape: SoftmaxShape, causal: bool) -> KernelSource:
    vectorized = shape.vector > 1
    args = (f"{ELEMENT_KINDS[dtype]}, {shape.threads_per_row}u, {shape.items}u, {str(vectorized).lower()}, "
            f"{str(causal).lower()}, {str(shape.streaming).lower()}, {shape.cluster}u, {shape.rows_in_flight}u")
    code = f"""\
#include <deepgemm/impls/softmax.cuh>
using Kernel = deepgemm::SoftmaxForward<{args}>;
extern "C" __global__ void __launch_bounds__({shape.cta_threads})
deepgemm_softmax(const void* x, deepgemm::u64 x_stride, void* y, deepgemm::u64 y_stride, deepgemm::u64 rows,
                 deepgemm::u32 n, float scale, deepgemm::u32 sq) {{
    Kernel::run(x, x_stride, y, y_stride, rows, n, scale, sq);
}}
"""
    label = (f"softmax {dtype} t={shape.threads_per_row} i={shape.items} v={shape.vector}"
             f"{' causal' if causal else ''}{' streaming' if shape.streaming else ''}"
             f"{f' cluster={shape.cluster}' if shape.cluster > 1 else ''}"
             f"{f' rows_in_flight={shape.rows_in_flight}' if shape.rows_in_flight > 1 else ''}")
    return KernelSource(code=code, entry="deepgemm_softmax", label=label)


def backward_source(dtype: torch.dtype, shape: SoftmaxShape) -> KernelSource:
    vectorized = shape.vector > 1
    args = (f"{ELEMENT_KINDS[dtype]}, {shape.threads_per_row}u, {shape.items}u, {str(vectorized).lower()}, "
            f"{str(shape.streaming).lower()}, {shape.cluster}u")
    code = f"""\
#include <deepgemm/impls/softmax.cuh>
using Kernel = deepgemm::SoftmaxBackward<{args}>;
extern "C" __global__ void __launch_bounds__({shape.cta_threads})
deepgemm_softmax_backward(const void* y, deepgemm::u64 y_stride, const void* dy, deepgemm::u64 dy_stride, void* dx,
                          deepgemm::u64 dx_stride, deepgemm::u64 rows, deepgemm::u32 n, float scale) {{
    Kernel::run(y, y_stride, dy, dy_stride, dx, dx_stride, rows, n, scale);
}}
"""
    label = (f"softmax_backward {dtype} t={shape.threads_per_row} i={shape.items} v={shape.vector}"
             f"{' streaming' if shape.streaming else ''}{f' cluster={shape.cluster}' if shape.cluster > 1 else ''}")
    return KernelSource(code=code, entry="deepgemm_softmax_backward", label=label)


# Launch-ready (kernel, config, args) of recent calls, keyed by every pointer, size, stride and option they pack and
# the stream: in a steady state the caching allocator hands out the same blocks, so a warm call packs nothing.
_ready: dict[tuple, tuple[LoadedKernel, Any, PackedArgs]] = {}
_READY_CAPACITY = 1024


def _remember(key: tuple, value: tuple[LoadedKernel, Any, PackedArgs]) -> tuple[LoadedKernel, Any, PackedArgs]:
    if len(_ready) >= _READY_CAPACITY:
        _ready.clear()
    _ready[key] = value
    return value


def softmax_forward_launch(x_ptr: int, x_stride: int, y_ptr: int, y_stride: int, rows: int, n: int,
                           dtype: torch.dtype, scale: float, causal: bool, sq: int, device_index: int,
                           shape: SoftmaxShape | None = None) -> None:
    """y = softmax(scale * x (+ causal mask)) row by row: x and y [rows, n] at the given addresses, rows `x_stride` /
    `y_stride` elements apart with unit column strides, rows > 0, n > 0; sq: query rows of the causal mask (rows is
    a multiple of it). `shape`: an explicit row group (experiments; its vector must fit the rows), else
    softmax_shape's."""
    stream = current_raw_stream(device_index)
    key = (x_ptr, x_stride, y_ptr, y_stride, rows, n, dtype, scale, causal, sq, stream, shape)
    ready = _ready.get(key)
    if ready is None:
        if shape is None:
            size = dtype.itemsize
            vectorized = n % vector_elements(dtype) == 0 and all(
                ptr % VECTOR_BYTES == 0 and (stride * size) % VECTOR_BYTES == 0
                for ptr, stride in ((x_ptr, x_stride), (y_ptr, y_stride)))
            shape = softmax_shape(n, dtype, vectorized, rows=rows, num_sms=physical_sm_count(device_index))
        kernel = load_kernel(forward_source(dtype, shape, causal), 0, device_index)
        args = PackedArgs([U64(x_ptr), U64(x_stride), U64(y_ptr), U64(y_stride), U64(rows), U32(n),
                           ctypes.c_float(scale), U32(sq)])
        config = kernel.launch_config(device_index, stream, shape.grid(rows), shape.cta_threads, shape.cluster)
        ready = _remember(key, (kernel, config, args))
    kernel, config, args = ready
    launch_on_device(kernel, device_index, stream, config, args.address)


def softmax_forward_cuda(x: torch.Tensor, y: torch.Tensor, scale: float, causal: bool, sq: int,
                         shape: SoftmaxShape | None = None) -> None:
    """softmax_forward_launch on tensors: x and y [rows, n] with unit column strides."""
    rows, n = x.shape
    softmax_forward_launch(x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), rows, n, x.dtype, scale, causal, sq,
                           x.device.index, shape)


def softmax_backward_cuda(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, scale: float) -> None:
    """dx = scale * y * (dy - rowsum(dy * y)): y, dy, dx [rows, n] with unit column strides, rows > 0, n > 0."""
    rows, n = y.shape
    device_index = y.device.index
    stream = current_raw_stream(device_index)
    key = ("backward", y.data_ptr(), y.stride(0), dy.data_ptr(), dy.stride(0), dx.data_ptr(), dx.stride(0), rows, n,
           y.dtype, scale, stream)
    ready = _ready.get(key)
    if ready is None:
        vectorized = n % vector_elements(y.dtype) == 0 and all(
            vector_aligned(t, t.stride(0)) for t in (y, dy, dx))
        shape = softmax_shape(n, y.dtype, vectorized, backward=True, rows=rows,
                              num_sms=physical_sm_count(device_index))
        kernel = load_kernel(backward_source(y.dtype, shape), 0, device_index)
        args = PackedArgs([U64(y.data_ptr()), U64(y.stride(0)), U64(dy.data_ptr()), U64(dy.stride(0)),
                           U64(dx.data_ptr()), U64(dx.stride(0)), U64(rows), U32(n), ctypes.c_float(scale)])
        config = kernel.launch_config(device_index, stream, shape.grid(rows), shape.cta_threads, shape.cluster)
        ready = _remember(key, (kernel, config, args))
    kernel, config, args = ready
    launch_on_device(kernel, device_index, stream, config, args.address)
