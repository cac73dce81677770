"""Graph-capture detection follows the tensors' device, not only the current one (issue 25, point 5).

A real test needs two GPUs (capture on cuda:1 while cuda:0 is current). These run anywhere: the device queries are
faked (monkeypatched): deepgemm.jit.runtime's bindings for the current device and the current stream's capture
status, torch.cuda.device (the switch stream_capturing makes), is_available / is_initialized. A fake machine of
two devices keeps which device is current and which one's current stream is capturing.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
import torch

import deepgemm
from deepgemm.api import kgrouped
from deepgemm.jit import runtime
from deepgemm.kernels.common import loader


class FakeDevices:
    """Two CUDA devices: `current` is the current one, `capturing` the set whose current stream captures."""

    def __init__(self) -> None:
        self.current = 0
        self.capturing: set[int] = set()
        self.switches = 0

    def is_capturing(self) -> bool:
        return self.current in self.capturing

    @contextmanager
    def device(self, index: int):  # noqa: ANN201  (stands in for torch.cuda.device)
        previous, self.current = self.current, index
        self.switches += 1
        try:
            yield
        finally:
            self.current = previous


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> FakeDevices:
    fake = FakeDevices()
    monkeypatch.setattr(runtime, "_current_device", lambda: fake.current)
    monkeypatch.setattr(runtime, "_current_stream_capturing", fake.is_capturing)
    monkeypatch.setattr(torch.cuda, "device", fake.device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current)
    return fake


def test_stream_capturing_asks_the_tensors_device(devices: FakeDevices) -> None:
    devices.capturing = {1}
    assert runtime.stream_capturing(1) is True  # capture on cuda:1 while cuda:0 is current
    assert runtime.stream_capturing(0) is False
    assert devices.current == 0, "the current device must be restored"
    devices.current = 1
    switches = devices.switches
    assert runtime.stream_capturing(1) is True
    assert devices.switches == switches, "no device switch when the tensors' device is the current one"


def test_refuse_during_capture_covers_the_tensors_device(devices: FakeDevices) -> None:
    devices.capturing = {1}
    with pytest.raises(deepgemm.GraphCaptureError, match="cuda:1"):
        runtime.refuse_during_capture("kernel x", 1)
    runtime.refuse_during_capture("kernel x", 0)  # neither cuda:0 nor the current device captures
    runtime.refuse_during_capture("kernel x")
    devices.capturing = {0}  # the current device captures: refused whatever the tensors' device
    with pytest.raises(deepgemm.GraphCaptureError):
        runtime.refuse_during_capture("kernel x", 1)
    with pytest.raises(deepgemm.GraphCaptureError):
        runtime.refuse_during_capture("kernel x")


def test_refuse_during_capture_without_cuda_context(devices: FakeDevices, monkeypatch: pytest.MonkeyPatch) -> None:
    devices.capturing = {0, 1}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    runtime.refuse_during_capture("kernel x", 1)  # no context in the process: nothing can be capturing


def test_cold_load_for_tensors_on_a_capturing_device_is_refused(devices: FakeDevices,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from deepgemm.jit.compiler import KernelSource

    def no_compile(*args: object) -> None:
        raise AssertionError("compiled under capture")

    monkeypatch.setattr(loader, "compile_kernel", no_compile)
    devices.capturing = {1}
    source = KernelSource(code="// never compiled\n", entry="deepgemm_probe", label="probe kernel")
    with pytest.raises(deepgemm.GraphCaptureError, match="probe kernel.*cuda:1"):
        loader.load_kernel(source, 0, 1)


def test_k_grouped_offsets_follow_the_tensors_device(devices: FakeDevices) -> None:
    offsets = kgrouped._DeviceOffsets()
    devices.capturing = {1}
    with pytest.raises(deepgemm.GraphCaptureError, match="new ks"):
        offsets.get(torch.device("cuda", 1), (128, 256))  # a new ks would upload under cuda:1's capture
    # A known ks under capture on the tensors' device: the entry moves to the never-freed table (a graph reads it).
    upload = kgrouped._Upload(torch.zeros(3, dtype=torch.int32), stream=7, done=None)  # type: ignore[arg-type]
    offsets._recent[(1, (128, 256))] = upload
    assert offsets.get(torch.device("cuda", 1), (128, 256)) is upload.tensor
    assert (1, (128, 256)) in offsets._captured and (1, (128, 256)) not in offsets._recent


def test_capture_query_host_cost(devices: FakeDevices) -> None:
    """Host cost of the check per call with the queries faked (their own cost is a C call each on a real GPU): the
    Python around them stays well under a microsecond on the current device. Printed; bounded loosely (shared CI
    cores)."""
    devices.capturing = set()
    calls = 20000
    for index, label in ((0, "current device"), (1, "other device")):
        start = time.perf_counter()
        for _ in range(calls):
            runtime.stream_capturing(index)
        per_call = (time.perf_counter() - start) / calls * 1e6
        print(f"stream_capturing, {label}: {per_call:.3f} us per call (queries faked)")
        if index == 0:
            assert per_call < 5.0
