"""Shared test configuration: the `gpu` marker skips unless a Hopper (sm_90) GPU is present."""

from __future__ import annotations

import pytest
import torch


def hopper_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hopper_available():
        return
    skip = pytest.mark.skip(reason="needs a Hopper (sm_90) GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unless a test sets its own, compile into one per-session cache dir (never the user's ~/.cache)."""
    import os

    if "DEEPGEMM_CACHE_DIR" not in os.environ:
        monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "deepgemm-cache"))


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`deepgemm bench` run in-process writes its default results folder under the session's temp dir, never into
    the working directory (a subprocess run passes --results-dir)."""
    from deepgemm.bench import results_dir

    monkeypatch.setattr(results_dir, "DEFAULT_RESULTS_ROOT", tmp_path_factory.getbasetemp() / "deepgemm-results")


@pytest.fixture
def small_fp8_route(monkeypatch: pytest.MonkeyPatch) -> int:
    """Let small test layers take the FP8 path (the shipped rule routes weights under 8M elements to a BF16 matmul,
    a measured speed choice; the tests keep CPU work small). Returns the threshold in force."""
    import deepgemm.api.backend as backend

    monkeypatch.setattr(backend, "FP8_LINEAR_MIN_WEIGHT_ELEMENTS", 256 * 256)
    return 256 * 256


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, printed (pytest shows it on failure) and given to torch's global generator."""
    import random

    value = random.randrange(2**31)
    print(f"seed={value}")
    torch.manual_seed(value)
    return value


@pytest.fixture(autouse=True)
def gpu_guard(request: pytest.FixtureRequest):  # noqa: ANN201
    """For every test marked `gpu`: the kernels must serve CUDA tensors here, and the reference path must not run on
    them; any reference call on CUDA tensors fails the test, even one the code under test swallowed. Yields a
    tests.gpu.guard.GpuGuard (reference calls, kernel launch counts); None for other tests."""
    if request.node.get_closest_marker("gpu") is None:
        yield None
        return
    from tests.gpu.guard import guarding, require_kernel_backend

    require_kernel_backend()
    with guarding() as guard:
        yield guard
        guard.verify()
