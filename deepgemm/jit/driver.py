"""Thin checked access to the CUDA driver API through cuda.bindings."""

from __future__ import annotations

from typing import Any

from deepgemm.errors import DeepGemmError


def driver() -> Any:
    from cuda.bindings import driver as cu  # imported lazily: CPU-only users never load libcuda

    return cu


def check(result: tuple[Any, ...], what: str) -> Any:
    """Unwrap a cuda.bindings (err, value...) tuple, raising DeepGemmError on a non-success code."""
    cu = driver()
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        decoded = (name or b"?").decode(), (text or b"").decode()
        raise DeepGemmError(f"{what} failed: {decoded[0]} ({decoded[1]})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
