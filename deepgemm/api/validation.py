"""Argument checks that raise TypeError/ValueError naming the argument and the rule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from deepgemm.errors import NotDifferentiableError

TMA_ALIGNMENT = 16


def require_tensor(value: Any, name: str, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: '{name}' must be a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise TypeError(f"{where}: '{name}' must be a dense (strided) tensor, got layout {value.layout}")
    return value


def require_pair(value: Any, name: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{where}: '{name}' must be a (fp8 tensor, float32 scales) pair, got {type(value).__name__}")
    return require_tensor(value[0], f"{name}[0]", where), require_tensor(value[1], f"{name}[1]", where)


def require_dtype(t: torch.Tensor, name: str, where: str, dtypes: Iterable[torch.dtype]) -> None:
    allowed = tuple(dtypes)
    if t.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{where}: '{name}' must have dtype {names}, got {t.dtype}")


def require_rank(t: torch.Tensor, name: str, where: str, rank: int) -> None:
    if t.dim() != rank:
        raise ValueError(f"{where}: '{name}' must be {rank}-D, got shape {tuple(t.shape)}")


def require_shape(t: torch.Tensor, name: str, where: str, shape: tuple[int, ...], rule: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{where}: '{name}' must have shape {shape} ({rule}), got {tuple(t.shape)}")


def require_same_device(where: str, **tensors: torch.Tensor) -> torch.device:
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{where}: '{name}' is on {t.device} but '{first_name}' is on {first.device}; all must share a device")
    return first.device


def require_tma_rows(t: torch.Tensor, name: str, where: str) -> None:
    """Rows must be contiguous, 16-byte aligned at the base and 16-byte apart (TMA's rule): `require_tma_strides`
    (metadata) and `require_aligned` (the data pointer) together."""
    require_tma_strides(t, name, where)
    require_aligned(t, name, where)


def require_int(value: Any, name: str, where: str, allowed: Iterable[int]) -> int:
    options = tuple(allowed)
    if isinstance(value, bool) or not isinstance(value, int) or value not in options:
        raise ValueError(f"{where}: '{name}' must be one of {options}, got {value!r}")
    return value


MAX_ROWS = 2**31 - 1  # TMA coordinates and the kernels' row indices are 32-bit signed


def require_row_count(rows: int, what: str, where: str) -> None:
    if rows > MAX_ROWS:
        raise ValueError(f"{where}: {what} = {rows} exceeds the kernels' 32-bit index limit ({MAX_ROWS})")


FP8_NOT_DIFFERENTIABLE = ("FP8 GEMMs and quantizers are not differentiable yet; call under torch.no_grad() or "
                          "torch.inference_mode(), or detach the input")


def refuse_grad(where: str, **tensors: torch.Tensor | None) -> None:
    """FP8 ops have no backward yet: with grad mode on, an input (or `out`) that requires grad is an error on every
    path (the reference path would otherwise record a graph the kernel path cannot)."""
    refuse_grad_for(where, FP8_NOT_DIFFERENTIABLE, tensors)


def refuse_grad_for(where: str, reason: str, tensors: Mapping[str, torch.Tensor | None]) -> None:
    """refuse_grad for any form that records no graph (e.g. the BF16 out= forms), `reason` ending the message."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise NotDifferentiableError(f"{where}: '{name}' requires grad, but {reason}")


# ---------------------------------------------------------------- layout rules shared by every path
#
# The public GEMMs apply one set of rules before the path (kernel or reference) is chosen, so code tested on CPU
# behaves the same on Hopper. The rules split in two steps:
#   * metadata (shapes, strides, dtypes): the `check_*` functions the custom ops' fake kernels also run;
#   * memory (data pointers: 16-byte alignment, overlap of the output with the other arguments): run by the eager
#     checked path only, as fake tensors have no real storage.
# Both run once per argument set: a launch-ready argument set (same pointers, shapes, strides, dtypes) skips them.


def require_k_multiple_of_16(k: int, name: str, where: str) -> None:
    if k % 16 != 0:
        raise ValueError(f"{where}: '{name}' has K={k} columns; K must be a multiple of 16 (each FP8 row must span "
                         "whole 16-byte TMA units)")


def require_tma_strides(t: torch.Tensor, name: str, where: str) -> None:
    """The stride part of TMA's rule for a 2-D tensor: unit stride along the last dimension, rows a multiple of 16
    bytes apart. (The base pointer's alignment is `require_aligned`.) An empty tensor is never read: no rule."""
    shape, stride = t.shape, t.stride()
    if shape[0] == 0 or shape[1] == 0:
        return
    if shape[1] > 1 and stride[1] != 1:
        raise ValueError(f"{where}: '{name}' must have unit stride along its last dimension, got strides {stride}")
    if shape[0] > 1 and (stride[0] * t.element_size()) % TMA_ALIGNMENT != 0:
        raise ValueError(
            f"{where}: '{name}' row stride must be a multiple of {TMA_ALIGNMENT} bytes (TMA rule); "
            f"got {stride[0]} elements of {t.element_size()} bytes"
        )


def require_stacked_strides(t: torch.Tensor, name: str, where: str) -> None:
    """A 3-D tensor whose groups follow each other row after row (so it views as [G*rows, cols]), with unit stride
    along its last dimension and rows a multiple of 16 bytes apart. An empty tensor is never read: no rule."""
    shape, stride = t.shape, t.stride()
    if 0 in shape:
        return
    if shape[0] > 1 and stride[0] != shape[1] * stride[1]:
        raise ValueError(f"{where}: '{name}' groups must be stacked row after row (stride(0) == shape[1] * stride(1)), "
                         f"got strides {stride}")
    if shape[2] > 1 and stride[2] != 1:
        raise ValueError(f"{where}: '{name}' must have unit stride along its last dimension, got strides {stride}")
    if shape[1] > 1 and stride[1] == 0:
        raise ValueError(f"{where}: '{name}' rows are 0 bytes apart (a broadcast, strides {stride}); TMA walks rows by "
                         "a positive stride: pass a materialized tensor (.contiguous())")
    if shape[1] > 1 and (stride[1] * t.element_size()) % TMA_ALIGNMENT:
        raise ValueError(f"{where}: '{name}' rows must be a multiple of {TMA_ALIGNMENT} bytes apart (TMA rule); got "
                         f"strides {stride} of {t.element_size()}-byte elements")


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True when two elements of `t` share memory (a zero stride, rows closer than their width): each dimension of
    size > 1, by increasing stride, must step past everything the smaller ones span."""
    if t.is_contiguous() or 0 in t.shape:
        return False
    extent = 0
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= extent:
            return True
        extent += stride * (size - 1)
    return False


def require_output(t: torch.Tensor, name: str, where: str) -> None:
    """A tensor the call writes in place: writable here, with one element per memory location."""
    require_writable(t, name, where)
    require_no_self_overlap(t, name, where)


def require_writable(t: torch.Tensor, name: str, where: str) -> None:
    """Not an inference tensor outside inference mode: torch refuses in-place writes to those (the reference path
    makes such writes; the kernels would write through the pointer, so one rule holds for both paths)."""
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{where}: '{name}' was created under torch.inference_mode(), and torch refuses in-place "
                         f"writes to it outside that mode: call under torch.inference_mode() too, or allocate "
                         f"'{name}' outside it")


def require_no_self_overlap(t: torch.Tensor, name: str, where: str) -> None:
    if has_internal_overlap(t):
        raise ValueError(f"{where}: '{name}' overlaps itself (shape {tuple(t.shape)}, strides {t.stride()}: a zero "
                         "stride or rows closer than their width); outputs need one element per memory location")


def require_aligned(t: torch.Tensor, name: str, where: str) -> None:
    """The base of a non-empty tensor the kernel reads through TMA (or writes in 16-byte units) is 16-byte aligned.
    (Meta tensors have no memory: every data pointer is 0, and the memory rules pass.)"""
    if t.data_ptr() % TMA_ALIGNMENT and 0 not in t.shape:
        raise ValueError(f"{where}: '{name}' data pointer must be {TMA_ALIGNMENT}-byte aligned (TMA rule), "
                         f"got one {t.data_ptr() % TMA_ALIGNMENT} bytes past a 16-byte boundary")


def _byte_end(t: torch.Tensor, start: int) -> int:
    """One past the last byte the elements of `t` (non-empty, based at `start`) can touch."""
    if t.is_contiguous():
        return start + t.nbytes
    span = 1
    for size, stride in zip(t.shape, t.stride()):
        span += (size - 1) * stride
    return start + span * t.element_size()


def require_no_overlap(where: str, out_name: str, out: torch.Tensor,
                       inputs: tuple[tuple[str, torch.Tensor | None], ...]) -> None:
    """`out` shares no memory with any of `inputs` ((name, tensor or None) pairs): their byte ranges do not intersect
    (addresses are unique across devices and host memory, so intersecting ranges are one allocation). Conservative
    for interleaved views of one buffer. Meta tensors have no memory (every data pointer is 0): nothing overlaps."""
    if 0 in out.shape or out.is_meta:
        return
    begin = out.data_ptr()
    end = _byte_end(out, begin)
    for name, t in inputs:
        if t is None:
            continue
        start = t.data_ptr()
        if start < end and 0 not in t.shape and begin < _byte_end(t, start):
            raise ValueError(f"{where}: '{out_name}' overlaps '{name}' in memory; the output must not share memory "
                             "with an input (pass a separate tensor)")
