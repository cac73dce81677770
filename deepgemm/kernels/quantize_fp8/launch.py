"""GPU FP8 quantization kernels (per-token-group, its transposed form, per-block): instantiation and launch."""

from __future__ import annotations

from typing import Any

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.compiler import KernelSource
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.kernels.common.elements import ELEMENT_KINDS
from deepgemm.kernels.common.grid import MAX_GRID_Y
from deepgemm.kernels.common.loader import load_kernel
from deepgemm.utils import align_up, ceil_div

_THREADS = 256
_BLOCK_CTAS_PER_SM = 2  # vectorized per-block quantizer: at most 128 registers, so two CTAs (16 warps of loads)
# share an SM (the scalar transposed form would spill under that cap: its 64 loads keep 64 addresses live)


def token_group_source(dtype: torch.dtype, group_size: int, silu_mul: bool = False) -> KernelSource:
    """The per-token-group quantizer; silu_mul: x [M, 2K] = [gate | up], silu(gate) * up quantized (k: the
    output's K)."""
    activation, name = (", deepgemm::Activation::kSiluMul", "quantize_silu_mul_per_token_group") if silu_mul else (
        "", "quantize_per_token_group")
    code = f"""\
#include <deepgemm/impls/quantize_fp8.cuh>
using Kernel = deepgemm::QuantizePerTokenGroup<{ELEMENT_KINDS[dtype]}, {group_size}u{activation}>;
extern "C" __global__ void __launch_bounds__({_THREADS})
deepgemm_{name}(const void* x, deepgemm::u64 x_row_stride, deepgemm::u8* q, deepgemm::u64 q_row_stride, float* sf,
                deepgemm::u32 sf_stride, deepgemm::u32 m, deepgemm::u32 k, deepgemm::u32 vectorized) {{
    Kernel::run(x, x_row_stride, q, q_row_stride, sf, sf_stride, m, k, vectorized);
}}
"""
    label = f"{'silu_mul_' if silu_mul else ''}quantize_per_token_group {dtype} g={group_size}"
    return KernelSource(code=code, entry=f"deepgemm_{name}", label=label)


def block_source(dtype: torch.dtype, block: int, transposed: bool = False, k_fastest: bool = True,
                 vectorized: bool | None = None) -> KernelSource:
    """The per-block quantizer; transposed: it also writes q^T [K, N] and sf^T. k_fastest: the grid is (K blocks,
    N blocks), for at most 65535 N blocks; else (N blocks, K blocks). vectorized: 16-byte loads (block_vectorizable;
    None: wherever the block's layout has them)."""
    if vectorized is None:
        vectorized = block_vector_layout(dtype.itemsize, block)
    flag = {True: "true", False: "false"}
    entry = "deepgemm_quantize_per_block_transposed" if transposed else "deepgemm_quantize_per_block"
    extra = ", deepgemm::u8* qt, deepgemm::u64 qt_row_stride, float* sft" if transposed else ""
    code = f"""\
#include <deepgemm/impls/quantize_fp8.cuh>
using Kernel = deepgemm::QuantizePerBlock<{ELEMENT_KINDS[dtype]}, {block}u, {flag[transposed]}, {flag[k_fastest]},
                                          {flag[vectorized]}>;
extern "C" __global__ void __launch_bounds__({_THREADS}, {_BLOCK_CTAS_PER_SM if vectorized else 1})
{entry}(const void* w, deepgemm::u64 w_row_stride, deepgemm::u8* q, deepgemm::u64 q_row_stride, float* sf,
                deepgemm::u32 n, deepgemm::u32 k{extra}) {{
    Kernel::run(w, w_row_stride, q, q_row_stride, sf, n, k{", qt, qt_row_stride, sft" if transposed else ""});
}}
"""
    label = (f"quantize_per_block {dtype} b={block}{' +transposed' if transposed else ''}"
             f"{'' if k_fastest else ' n-fastest'}{'' if vectorized else ' scalar'}")
    return KernelSource(code=code, entry=entry, label=label)


TRANSPOSED_GROUP = 128  # the transposed quantizer's token group (QuantizeTransposed::kTokens)


def transposed_columns(rows_too: bool) -> int:
    """Columns of x per CTA (QuantizeTransposed::kCols)."""
    return 128 if rows_too else 64


def transposed_smem_bytes(dtype: torch.dtype, rows_too: bool) -> int:
    """QuantizeTransposed::kSmemBytes: the staged tile of raw elements (a row pitch of one 4-byte word over kCols)
    and the column parts' float maxima."""
    cols, size = transposed_columns(rows_too), dtype.itemsize
    return TRANSPOSED_GROUP * (cols + 4 // size) * size + (_THREADS // cols) * cols * 4


def transposed_source(dtype: torch.dtype, rows_too: bool = False) -> KernelSource:
    """x [T, C] -> qt [C, T_out] quantized per 1x128 group along T (QuantizeTransposed); rows_too: also q [T, C]
    quantized per 1x128 group along C, in the same pass."""
    name = "quantize_both_ways" if rows_too else "quantize_transposed"
    code = f"""\
#include <deepgemm/impls/quantize_fp8.cuh>
using Kernel = deepgemm::QuantizeTransposed<{ELEMENT_KINDS[dtype]}, {"true" if rows_too else "false"}>;
static_assert(Kernel::kSmemBytes == {transposed_smem_bytes(dtype, rows_too)}, "host mirror of the shared memory size");
extern "C" __global__ void __launch_bounds__({_THREADS})
deepgemm_{name}(const void* x, deepgemm::u64 x_row_stride, deepgemm::u32 t, deepgemm::u32 c, deepgemm::u8* qt,
                deepgemm::u64 qt_row_stride, deepgemm::u32 t_out, float* sft, deepgemm::u32 sft_stride,
                deepgemm::u32 vectorized, deepgemm::u8* q, deepgemm::u64 q_row_stride, float* sf,
                deepgemm::u32 sf_stride) {{
    Kernel::run(x, x_row_stride, t, c, qt, qt_row_stride, t_out, sft, sft_stride, vectorized, q, q_row_stride, sf,
                sf_stride);
}}
"""
    return KernelSource(code=code, entry=f"deepgemm_{name}", label=f"{name.replace('_', ' ', 1)} {dtype}")


_token_group_kernels: dict[tuple[torch.dtype, int, bool], LoadedKernel] = {}
# Launch-ready arguments of recent calls, keyed by every pointer, shape and stride they pack and the stream: in a
# steady state the caching allocator hands out the same blocks, so a warm call packs nothing.
_token_group_ready: dict[tuple, tuple[LoadedKernel, Any, PackedArgs]] = {}
_READY_CAPACITY = 1024


def _token_group_kernel(dtype: torch.dtype, group_size: int, device_index: int | None = None,
                        silu_mul: bool = False) -> LoadedKernel:
    key = (dtype, group_size, silu_mul)
    kernel = _token_group_kernels.get(key)
    if kernel is None:
        kernel = _token_group_kernels[key] = load_kernel(token_group_source(dtype, group_size, silu_mul), 0,
                                                         device_index)
    return kernel


def _vectorizable(x: torch.Tensor, k: int | None = None) -> bool:
    """The kernel's 16-byte path: x's base and rows 16-byte aligned, K (the output's columns; a gated x holds 2K,
    the up half starting K columns in) a whole number of vectors (q is fresh and contiguous, so its rows then
    align too)."""
    elems = 16 // x.element_size()
    k = x.shape[1] if k is None else k
    return x.data_ptr() % 16 == 0 and (x.stride(0) * x.element_size()) % 16 == 0 and k % elems == 0


def block_vector_layout(element_size: int, block: int) -> bool:
    """Whether a warp's rows of a block are a whole number of warp-wide 16-byte loads (all but 16-bit input with
    block 32: QuantizePerBlock::kCanVectorize)."""
    rows_per_warp, lanes_per_row = block // 8, block // (16 // element_size)
    return rows_per_warp % (32 // lanes_per_row) == 0


def block_vectorizable(w: torch.Tensor, block: int) -> bool:
    """The per-block kernel's 16-byte path: w 16-byte aligned as for the token groups, and the block's layout."""
    return _vectorizable(w) and block_vector_layout(w.element_size(), block)


def _groups_per_warp(x: torch.Tensor, group_size: int, vectorized: bool) -> int:
    """Groups one warp quantizes: 32 / (lanes per group) on the 16-byte path (QuantizePerTokenGroup::kGroupsPerWarp),
    one on the scalar path."""
    if not vectorized:
        return 1
    vectors = group_size // (16 // x.element_size())
    return max(1, 32 // vectors)


def token_group_launch(x: torch.Tensor, q: torch.Tensor, sf: torch.Tensor, group_size: int, device_index: int,
                       stream: int, silu_mul: bool = False) -> tuple[LoadedKernel, Any, PackedArgs]:
    """(kernel, launch config, packed arguments) quantizing x [M, K] (silu_mul: [M, 2K] = [gate | up], quantizing
    silu(gate) * up; unit column stride, M and K > 0) into q (contiguous e4m3 [M, K]) and sf (M-major
    [M, ceil(K/g)]) on `stream`: packed once per pointer set."""
    m, k = q.shape
    sf_stride = sf.stride(1)
    key = (x.data_ptr(), m, k, x.stride(0), x.dtype, group_size, q.data_ptr(), sf.data_ptr(), sf_stride, stream,
           silu_mul)
    ready = _token_group_ready.get(key)
    if ready is None:
        kernel = _token_group_kernel(x.dtype, group_size, device_index, silu_mul)
        vectorized = _vectorizable(x, k)
        groups = ceil_div(k, group_size)
        grid = ceil_div(ceil_div(m * groups, _groups_per_warp(x, group_size, vectorized)) * 32, _THREADS)
        args = PackedArgs(
            [U64(x.data_ptr()), U64(x.stride(0)), U64(q.data_ptr()), U64(q.stride(0)), U64(sf.data_ptr()),
             U32(sf_stride), U32(m), U32(k), U32(vectorized)]
        )
        if len(_token_group_ready) >= _READY_CAPACITY:
            _token_group_ready.clear()
        ready = _token_group_ready[key] = (kernel, kernel.launch_config(device_index, stream, grid, _THREADS), args)
    return ready


def quantize_per_token_group_cuda(x: torch.Tensor, group_size: int,
                                  silu_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit column stride) -> (q e4m3 [M, K], sf [M, ceil(K/g)] with strides (1, align(M, 4))).
    silu_mul: x is [M, 2K] = [gate | up] and silu(gate) * up is quantized, in one pass (the activation never
    reaches memory)."""
    m, k = x.shape[0], x.shape[1] // 2 if silu_mul else x.shape[1]
    device = x.device
    # (Sizes as separate ints: torch parses them ~1 us faster than a tuple.)
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=device)
    sf = torch.empty_strided((m, ceil_div(k, group_size)), (1, align_up(m, 4)), dtype=torch.float32,
                             device=device)  # one op, not three
    if m == 0 or k == 0:
        return q, sf
    device_index = device.index
    stream = current_raw_stream(device_index)
    kernel, config, args = token_group_launch(x, q, sf, group_size, device_index, stream, silu_mul)
    launch_on_device(kernel, device_index, stream, config, args.address)
    return q, sf


_transposed_kernels: dict[tuple[torch.dtype, bool], LoadedKernel] = {}
_transposed_ready: dict[tuple, tuple[LoadedKernel, Any, PackedArgs]] = {}


def quantize_transposed_cuda(x: torch.Tensor, tokens_out: int, rows_too: bool = False) -> tuple[torch.Tensor, ...]:
    """x [T, C] (unit column stride) -> (qt e4m3 [C, tokens_out], sft [C, ceil(tokens_out/128)] with strides
    (1, align(C, 4))): x^T quantized per 1x128 group along T, tokens T..tokens_out (tokens_out >= T) zeros. rows_too:
    (q, sf, qt, sft), where (q [T, C], sf [T, ceil(C/128)] M-major) is quantize_per_token_group(x), same pass."""
    t, c = x.shape
    device = x.device
    qt = torch.empty(c, tokens_out, dtype=torch.float8_e4m3fn, device=device)
    groups = ceil_div(tokens_out, TRANSPOSED_GROUP)
    sft = torch.empty_strided((c, groups), (1, align_up(c, 4)), dtype=torch.float32, device=device)
    q = sf = None
    if rows_too:
        q = torch.empty(t, c, dtype=torch.float8_e4m3fn, device=device)
        sf = torch.empty_strided((t, ceil_div(c, TRANSPOSED_GROUP)), (1, align_up(t, 4)), dtype=torch.float32,
                                 device=device)
    outputs = (qt, sft) if q is None or sf is None else (q, sf, qt, sft)
    if c == 0 or tokens_out == 0:
        return outputs
    device_index = device.index
    stream = current_raw_stream(device_index)
    key = (x.data_ptr(), t, c, x.stride(0), x.dtype, qt.data_ptr(), tokens_out, sft.data_ptr(), stream, rows_too,
           0 if q is None else q.data_ptr(), 0 if sf is None else sf.data_ptr())
    ready = _transposed_ready.get(key)
    if ready is None:
        kernel = _transposed_kernels.get((x.dtype, rows_too))
        if kernel is None:
            kernel = _transposed_kernels[(x.dtype, rows_too)] = load_kernel(
                transposed_source(x.dtype, rows_too), transposed_smem_bytes(x.dtype, rows_too), device_index)
        args = PackedArgs([U64(x.data_ptr()), U64(x.stride(0)), U32(t), U32(c), U64(qt.data_ptr()), U64(tokens_out),
                           U32(tokens_out), U64(sft.data_ptr()), U32(sft.stride(1)), U32(_vectorizable(x)),
                           U64(0 if q is None else q.data_ptr()), U64(c), U64(0 if sf is None else sf.data_ptr()),
                           U32(0 if sf is None else sf.stride(1))])
        grid = (groups, ceil_div(c, transposed_columns(rows_too)))
        config = kernel.launch_config_2d(device_index, stream, grid, _THREADS)
        if len(_transposed_ready) >= _READY_CAPACITY:
            _transposed_ready.clear()
        ready = _transposed_ready[key] = (kernel, config, args)
    kernel, config, args = ready
    launch_on_device(kernel, device_index, stream, config, args.address)
    return outputs


_block_kernels: dict[tuple[torch.dtype, int, bool, bool, bool], LoadedKernel] = {}


def quantize_per_block_cuda(w: torch.Tensor, block: int, transposed: bool = False
                            ) -> tuple[torch.Tensor, ...]:
    """w [N, K] (unit column stride) -> (q e4m3 [N, K], sf [ceil(N/b), ceil(K/b)] row-major), and with transposed
    also qt = q^T as a contiguous e4m3 [K, N] and sft = sf^T row-major (written by the same pass)."""
    n, k = w.shape
    q = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=w.device)
    sf = torch.empty((ceil_div(n, block), ceil_div(k, block)), dtype=torch.float32, device=w.device)
    extra: tuple[torch.Tensor, ...] = ()
    if transposed:
        extra = (torch.empty((k, n), dtype=torch.float8_e4m3fn, device=w.device),
                 torch.empty((sf.shape[1], sf.shape[0]), dtype=torch.float32, device=w.device))
    if n == 0 or k == 0:
        return (q, sf, *extra)
    # Grid (K blocks, N blocks): resident CTAs cover whole rows of w; (N blocks, K blocks) past CUDA's grid y limit
    # of 65535 N blocks (x takes up to 2^31 - 1; the API allows at most 65535 K blocks).
    k_fastest = sf.shape[0] <= MAX_GRID_Y
    vectorized = block_vectorizable(w, block)
    key = (w.dtype, block, transposed, k_fastest, vectorized)
    kernel = _block_kernels.get(key)
    if kernel is None:
        kernel = _block_kernels[key] = load_kernel(block_source(*key), 0, w.device.index)
    grid = (sf.shape[1], sf.shape[0]) if k_fastest else (sf.shape[0], sf.shape[1])
    values = [U64(w.data_ptr()), U64(w.stride(0)), U64(q.data_ptr()), U64(q.stride(0)), U64(sf.data_ptr()), U32(n),
              U32(k)]
    if extra:
        values += [U64(extra[0].data_ptr()), U64(extra[0].stride(0)), U64(extra[1].data_ptr())]
    args = PackedArgs(values)
    device_index = w.device.index
    stream = current_raw_stream(device_index)
    config = kernel.launch_config_2d(device_index, stream, grid, _THREADS)
    launch_on_device(kernel, device_index, stream, config, args.address)
    return (q, sf, *extra)
