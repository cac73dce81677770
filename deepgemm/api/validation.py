"""Argument checks that raise TypeError/ValueError naming the argument and the rule."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from deepgemm.errors import NotDifferentiableError

TMA_ALIGNMENT = 16


def require_tensor(value: Any, name: str, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: '{name}' must be a torch.Tensor, got {type(value).__name__}")
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
    """Rows must be contiguous, 16-byte aligned at the base and 16-byte apart (TMA's rule)."""
    elem = t.element_size()
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{where}: '{name}' must have unit stride along its last dimension, got strides {t.stride()}")
    if t.data_ptr() % TMA_ALIGNMENT != 0:
        raise ValueError(f"{where}: '{name}' data pointer must be {TMA_ALIGNMENT}-byte aligned (TMA rule)")
    if t.shape[0] > 1 and (t.stride(0) * elem) % TMA_ALIGNMENT != 0:
        raise ValueError(
            f"{where}: '{name}' row stride must be a multiple of {TMA_ALIGNMENT} bytes (TMA rule); "
            f"got {t.stride(0)} elements of {elem} bytes"
        )


def require_int(value: Any, name: str, where: str, allowed: Iterable[int]) -> int:
    options = tuple(allowed)
    if isinstance(value, bool) or not isinstance(value, int) or value not in options:
        raise ValueError(f"{where}: '{name}' must be one of {options}, got {value!r}")
    return value


MAX_ROWS = 2**31 - 1  # TMA coordinates and the kernels' row indices are 32-bit signed


def require_row_count(rows: int, what: str, where: str) -> None:
    if rows > MAX_ROWS:
        raise ValueError(f"{where}: {what} = {rows} rows exceeds the kernels' 32-bit row index limit ({MAX_ROWS})")


def refuse_grad(where: str, **tensors: torch.Tensor | None) -> None:
    """FP8 ops have no backward yet: with grad mode on, an input (or `out`) that requires grad is an error on every
    path (the reference path would otherwise record a graph the kernel path cannot)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise NotDifferentiableError(
                f"{where}: '{name}' requires grad, but FP8 GEMMs and quantizers are not differentiable yet; call "
                "under torch.no_grad() or torch.inference_mode(), or detach the input")
