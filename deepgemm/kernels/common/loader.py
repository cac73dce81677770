"""Compile-and-load with an in-process cache: one LoadedKernel per rendered source.

A hit is one dict lookup. A miss takes that kernel's own lock, so different kernels compile and load at the same
time while threads wanting the same kernel load it once; waiting longer than ``load_lock_timeout()`` for another
thread's load raises LockTimeoutError naming the kernel. A loaded kernel holds its module (cuLibrary), which stays
valid when the cubin file is deleted later.
"""

from __future__ import annotations

import threading

from deepgemm.errors import CacheError, LockTimeoutError
from deepgemm.jit import compiler
from deepgemm.jit.compiler import CompiledKernel, KernelSource, compile_kernel
from deepgemm.jit.runtime import LoadedKernel, refuse_during_capture

# Keyed by source, entry (one source may define several kernels) and dynamic shared memory.
_loaded: dict[tuple[str, str, int], LoadedKernel] = {}
_key_locks: dict[tuple[str, str, int], threading.Lock] = {}
_key_locks_guard = threading.Lock()


def load_lock_timeout() -> float:
    """How long a load waits for another thread loading the same kernel: that thread may wait for the disk
    cache's lock (``compiler.lock_timeout()``), then compile (``compiler.compile_timeout()``)."""
    return compiler.lock_timeout() + compiler.compile_timeout()


def load_kernel(source: KernelSource, dynamic_smem_bytes: int, device_index: int | None = None) -> LoadedKernel:
    """The loaded kernel of `source`, compiled and loaded on a miss. `device_index`: the device of the tensors it is
    for; a miss while that device's (or the current device's) stream is capturing a CUDA graph raises
    GraphCaptureError."""
    key = (source.code, source.entry, dynamic_smem_bytes)
    kernel = _loaded.get(key)
    if kernel is not None:
        return kernel
    return _load(source, dynamic_smem_bytes, key, device_index)


def _load(source: KernelSource, dynamic_smem_bytes: int, key: tuple[str, str, int],
          device_index: int | None = None) -> LoadedKernel:
    refuse_during_capture(source.label or source.entry, device_index)
    with _key_locks_guard:
        lock = _key_locks.setdefault(key, threading.Lock())
    timeout = load_lock_timeout()
    if not lock.acquire(timeout=min(timeout, threading.TIMEOUT_MAX)):  # DEEPGEMM_COMPILE_TIMEOUT=inf waits for ever
        raise LockTimeoutError(
            f"timed out after {timeout:g} s waiting for another thread to compile and load kernel "
            f"{_describe(source, dynamic_smem_bytes)} (the wait is twice DEEPGEMM_COMPILE_TIMEOUT plus a margin)"
        )
    try:
        kernel = _loaded.get(key)
        if kernel is None:
            compiled, cubin = _compiled_cubin(source)
            kernel = LoadedKernel(cubin, compiled.entry, dynamic_smem_bytes)
            _loaded[key] = kernel
    finally:
        lock.release()
    return kernel


def _compiled_cubin(source: KernelSource) -> tuple[CompiledKernel, bytes]:
    """The compiled kernel and its cubin's bytes. A cubin deleted between compile_kernel's check and the read is
    compiled again (compile_kernel sees it gone); one that cannot be read then raises CacheError."""
    compiled = compile_kernel(source)
    try:
        return compiled, compiled.cubin_path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise CacheError.from_os_error("read the cubin", compiled.cubin_path, exc) from exc
    compiled = compile_kernel(source)
    try:
        return compiled, compiled.cubin_path.read_bytes()
    except OSError as exc:
        raise CacheError.from_os_error("read the cubin", compiled.cubin_path, exc) from exc


def _describe(source: KernelSource, dynamic_smem_bytes: int) -> str:
    """The kernel's label, entry, dynamic shared memory and cache key, for messages."""
    try:
        key = compiler.kernel_key(source, compiler.compiler_choice())
    except Exception as exc:  # noqa: BLE001 - a message must not fail; say why the key is missing
        key = f"unavailable: {exc}"
    return (f"{source.label or source.entry!r} (entry {source.entry}, {dynamic_smem_bytes} bytes of dynamic "
            f"shared memory, cache key {key})")
