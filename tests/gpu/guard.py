"""What every GPU test runs under (the autouse `gpu_guard` fixture in tests/conftest.py): proof that the numbers
came from our kernels, not from the reference path the CPU tests use.

* Setup: `deepgemm.backend_for` on a CUDA tensor must say "sm90" (DEEPGEMM_FORCE_REFERENCE, missing cuda-bindings
  or a non-Hopper device would otherwise turn every GPU test into a reference-against-reference comparison).
* During the test: each reference function the package's API modules bound at import time (the names in
  deepgemm.api.* / deepgemm.ops.* / deepgemm.nn.* whose value is a `deepgemm.reference.*_reference` function, e.g.
  deepgemm.api.gemm.fp8_gemm_nt_reference) is replaced by a wrapper that raises AssertionError, and records the
  call, when any argument is a CUDA tensor. deepgemm.reference itself is not touched, so tests that compute a
  reference on purpose (deepgemm.reference.*, tests.helpers.reference_fp64) still do; calls on CPU tensors pass.
* Teardown: a recorded call fails the test even when the code under test swallowed the AssertionError (a bench
  runner that reports errors as a status, a worker thread, a `pytest.raises(Exception)`).
* Kernel launches (LoadedKernel.launch, the one place every kernel is launched from) are counted per entry point:
  `gpu_guard.launches("deepgemm_fp8_gemm")` lets a test assert that a GEMM kernel really ran.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest
import torch

# Modules whose bound reference functions are the reference *path* (the serving code). deepgemm.reference is the
# yardstick and stays callable; so do deepgemm.reference's helpers (dequantize_*, m_indices_from_psum), which are no
# path of their own.
GUARDED_PACKAGES = ("deepgemm.api", "deepgemm.ops", "deepgemm.nn")
REFERENCE_MODULE = "deepgemm.reference"

GEMM_ENTRY = "deepgemm_fp8_gemm"  # prefix of the GEMM kernels' entry points (1d2d dense/grouped, k-grouped 1d1d)
QUANTIZE_ENTRY = "deepgemm_quantize"


def _any_cuda_tensor(values: Iterable[Any]) -> bool:
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_cuda:
                return True
        elif isinstance(value, (tuple, list)):
            if _any_cuda_tensor(value):
                return True
        elif isinstance(value, dict):
            if _any_cuda_tensor(value.values()):
                return True
    return False


def _guarded_modules() -> Iterator[ModuleType]:
    import deepgemm  # noqa: F401  (imports deepgemm.api, deepgemm.ops and deepgemm.nn)

    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        if any(name == package or name.startswith(package + ".") for package in GUARDED_PACKAGES):
            yield module


def bound_reference_functions() -> list[tuple[ModuleType, str, Callable[..., Any]]]:
    """(module, attribute, function) for every deepgemm.reference.*_reference function bound in a guarded module."""
    found: list[tuple[ModuleType, str, Callable[..., Any]]] = []
    for module in _guarded_modules():
        for attribute, value in list(vars(module).items()):
            if (inspect.isfunction(value) and value.__module__ == REFERENCE_MODULE
                    and value.__name__.endswith("_reference")):
                found.append((module, attribute, value))
    return found


_ACTIVE: list[GpuGuard] = []  # the guard of the test running now (guarding() pushes and pops it)


class GpuGuard:
    """The per-test record: reference calls on CUDA tensors and kernel launches."""

    def __init__(self) -> None:
        self.reference_calls: list[str] = []  # "module.attribute" of each refused call, in order
        self.patched: list[str] = []  # "module.attribute" of each guarded name
        self._launches: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.counting_launches = False

    def launches(self, entry_prefix: str = "") -> int:
        """Kernel launches so far in this test whose entry point starts with `entry_prefix` (all by default)."""
        with self._lock:
            return sum(count for entry, count in self._launches.items() if entry.startswith(entry_prefix))

    def _count_launch(self, entry: str) -> None:
        with self._lock:
            self._launches[entry] += 1

    def _refuse(self, qualified: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if _any_cuda_tensor(args) or _any_cuda_tensor(kwargs.values()):
                # Recorded by the guard of the test running now: a wrapper captured during an earlier test (e.g.
                # by a custom op registered then) outlives that test's patch and would record into its old guard.
                guard = _ACTIVE[-1] if _ACTIVE else self
                guard.reference_calls.append(qualified)  # list.append: safe from worker threads
                raise AssertionError(
                    f"the reference path ran on CUDA tensors ({qualified}): a GPU test must check our kernels, "
                    "not the reference against itself")
            return original(*args, **kwargs)

        guarded.__module__ = __name__  # not a deepgemm.reference function: never guarded twice
        return guarded

    def verify(self) -> None:
        """AssertionError if a reference function ran on CUDA tensors during the test."""
        if self.reference_calls:
            calls = ", ".join(sorted(set(self.reference_calls)))
            raise AssertionError(f"the reference path ran on CUDA tensors {len(self.reference_calls)} time(s) during "
                                 f"this GPU test ({calls}); its results are not the kernels'")


def require_kernel_backend() -> None:
    """The kernels serve CUDA tensors on this machine (else every GPU test would compare the reference with itself)."""
    import deepgemm

    probe = torch.empty(0, device="cuda")
    backend = deepgemm.backend_for(probe)
    assert backend == "sm90", (
        f"deepgemm.backend_for(<CUDA tensor on {probe.device}>) is {backend!r}, not 'sm90': the GPU tests would run "
        "the reference path (DEEPGEMM_FORCE_REFERENCE set? cuda-bindings missing? not an sm_90 device?)")


@contextmanager
def guarding() -> Iterator[GpuGuard]:
    """Install the guard for one test; yields it; undoes every patch on exit (verification is the caller's)."""
    guard = GpuGuard()
    patch = pytest.MonkeyPatch()
    _ACTIVE.append(guard)
    try:
        for module, attribute, original in bound_reference_functions():
            qualified = f"{module.__name__}.{attribute}"
            patch.setattr(module, attribute, guard._refuse(qualified, original))
            guard.patched.append(qualified)
        from deepgemm.jit import runtime

        loaded_kernel = getattr(runtime, "LoadedKernel", None)
        original_launch = getattr(loaded_kernel, "launch", None)
        if loaded_kernel is not None and original_launch is not None:
            def counting_launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
                result = original_launch(kernel, *args, **kwargs)
                guard._count_launch(str(getattr(kernel, "entry", "?")))
                return result

            patch.setattr(loaded_kernel, "launch", counting_launch)
            guard.counting_launches = True
        yield guard
    finally:
        patch.undo()
        _ACTIVE.remove(guard)
