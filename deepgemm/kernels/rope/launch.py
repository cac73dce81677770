"""GPU rotary position embedding of q and k in one launch: instantiation, launch shape and launch."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from deepgemm.jit.args import U32, U64, PackedArgs
from deepgemm.jit.compiler import KernelSource
from deepgemm.jit.runtime import LoadedKernel, current_raw_stream, launch_on_device
from deepgemm.kernels.common.elements import ELEMENT_KINDS, vector_aligned, vector_elements
from deepgemm.utils import ceil_div, next_power_of_2
from deepgemm.kernels.common.loader import load_kernel

THREADS = 256


def lanes_per_row(rotary_dim: int, vector: int) -> int:
    """Lanes sharing one (token, head) row: enough for one step over its rotary_dim / 2 pairs, `vector` pairs a lane,
    at most a warp."""
    return min(32, next_power_of_2(ceil_div(rotary_dim // 2, vector)))


def rope_source(dtype: torch.dtype, cache_dtype: torch.dtype, interleaved: bool, vectorized: bool,
                positions_64: bool, lanes: int) -> KernelSource:
    args = (f"{ELEMENT_KINDS[dtype]}, {ELEMENT_KINDS[cache_dtype]}, {str(interleaved).lower()}, "
            f"{str(vectorized).lower()}, {str(positions_64).lower()}, {lanes}u")
    operand = "const void* {0}_in, void* {0}_out, u64 {0}_its, u64 {0}_ihs, u64 {0}_ots, u64 {0}_ohs, u32 {0}_heads, u32 {0}_dim"
    fields = "{{{0}_in, {0}_out, {0}_its, {0}_ihs, {0}_ots, {0}_ohs, {0}_heads, {0}_dim}}"
    code = f"""\
#include <deepgemm/impls/rope.cuh>
using namespace deepgemm;
using Kernel = Rope<{args}>;
extern "C" __global__ void __launch_bounds__({THREADS})
deepgemm_rope({operand.format("q")}, {operand.format("k")}, const void* cache, u64 cache_stride,
              const void* positions, u32 tokens, u64 num_positions, u32 rotary_dim, float sin_sign) {{
    const RopeOperand q{fields.format("q")}, k{fields.format("k")};
    Kernel::run(q, k, cache, cache_stride, positions, tokens, num_positions, rotary_dim, sin_sign);
}}
"""
    label = (f"rope {dtype} cache={cache_dtype} {'interleaved' if interleaved else 'neox'} lanes={lanes}"
             f"{' vectorized' if vectorized else ''}{' pos64' if positions_64 else ''}")
    return KernelSource(code=code, entry="deepgemm_rope", label=label)


def _operand_args(x: torch.Tensor, out: torch.Tensor) -> list[ctypes._SimpleCData]:
    return [U64(x.data_ptr()), U64(out.data_ptr()), U64(x.stride(0)), U64(x.stride(1)), U64(out.stride(0)),
            U64(out.stride(1)), U32(x.shape[1]), U32(x.shape[2])]


def _vectorizable(rotary_dim: int, tensors: list[torch.Tensor]) -> bool:
    """16-byte vectors of pairs: rotary_dim / 2 and every head_dim whole vectors, every base, token and head stride
    16-byte aligned."""
    vector = vector_elements(tensors[0].dtype)
    return (rotary_dim // 2) % vector == 0 and all(
        t.shape[2] % vector == 0 and vector_aligned(t, t.stride(0), t.stride(1)) for t in tensors)


_ready: dict[tuple, tuple[LoadedKernel, Any, PackedArgs]] = {}
_READY_CAPACITY = 1024


def _key(t: torch.Tensor | None) -> tuple:
    return () if t is None else (t.data_ptr(), t.shape, t.stride())


def rope_cuda(q: torch.Tensor, q_out: torch.Tensor, k: torch.Tensor | None, k_out: torch.Tensor | None,
              cache: torch.Tensor, positions: torch.Tensor, interleaved: bool, inverse: bool,
              metadata: tuple | None = None) -> None:
    """Rotate q (and k) [tokens, heads, head_dim] into q_out (k_out), which may be the inputs themselves (or new
    contiguous tensors); cache [P, R] with unit column stride, positions [tokens] int32 / int64 (contiguous);
    tokens > 0. inverse: the opposite rotation (the backward). `metadata`: a key that pins every shape, stride and
    dtype of the call (the api's warm key), so only the pointers are read here."""
    device_index = q.device.index
    stream = current_raw_stream(device_index)
    if metadata is not None:
        key: tuple = (metadata, q.data_ptr(), q_out.data_ptr(), None if k is None else k.data_ptr(),
                      None if k_out is None else k_out.data_ptr(), cache.data_ptr(), positions.data_ptr(), inverse,
                      stream)
    else:
        key = (_key(q), _key(q_out), _key(k), _key(k_out), _key(cache), _key(positions), q.dtype, cache.dtype,
               positions.dtype, interleaved, inverse, stream)
    ready = _ready.get(key)
    if ready is None:
        rotary_dim = cache.shape[1]
        tensors = [q, q_out] + ([] if k is None or k_out is None else [k, k_out])
        vectorized = _vectorizable(rotary_dim, tensors)
        lanes = lanes_per_row(rotary_dim, vector_elements(q.dtype) if vectorized else 1)
        kernel = load_kernel(rope_source(q.dtype, cache.dtype, interleaved, vectorized,
                                         positions.dtype == torch.int64, lanes), 0, device_index)
        # No k: an operand of zero heads (its pointers are never read).
        k_args = _operand_args(q, q_out)[:6] + [U32(0), U32(q.shape[2])] if k is None or k_out is None else \
            _operand_args(k, k_out)
        tokens = q.shape[0]
        args = PackedArgs(_operand_args(q, q_out) + k_args + [
            U64(cache.data_ptr()), U64(cache.stride(0)), U64(positions.data_ptr()), U32(tokens),
            U64(cache.shape[0]), U32(rotary_dim), ctypes.c_float(-1.0 if inverse else 1.0)])
        rows = tokens * (q.shape[1] + (0 if k is None else k.shape[1]))
        config = kernel.launch_config(device_index, stream, ceil_div(rows, THREADS // lanes), THREADS)
        if len(_ready) >= _READY_CAPACITY:
            _ready.clear()
        ready = _ready[key] = (kernel, config, args)
    kernel, config, args = ready
    launch_on_device(kernel, device_index, stream, config, args.address)
