"""Compile-and-load with an in-process cache: one LoadedKernel per rendered source."""

from __future__ import annotations

import threading

from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.jit.runtime import LoadedKernel, refuse_during_capture

_loaded: dict[tuple[str, int], LoadedKernel] = {}
_lock = threading.Lock()


def load_kernel(source: KernelSource, dynamic_smem_bytes: int) -> LoadedKernel:
    key = (source.code, dynamic_smem_bytes)
    kernel = _loaded.get(key)
    if kernel is not None:
        return kernel
    refuse_during_capture(source.label or source.entry)
    with _lock:
        kernel = _loaded.get(key)
        if kernel is None:
            compiled: CompiledKernel = compile_kernel(source)
            kernel = LoadedKernel(compiled.cubin_path.read_bytes(), compiled.entry, dynamic_smem_bytes)
            _loaded[key] = kernel
    return kernel
