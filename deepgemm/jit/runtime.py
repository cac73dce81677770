"""Loaded kernels and their launch: cuLibraryLoadData once, cuLaunchKernelEx per call."""

from __future__ import annotations

import threading
from typing import Any

import torch

from deepgemm.errors import GraphCaptureError
from deepgemm.jit.driver import check, driver


def current_raw_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


# The current device, read straight from the C binding: torch.cuda.current_device() adds a lazy-init check
# (~0.3 us) on a path that only runs after CUDA is initialized.
_current_device = torch._C._cuda_getDevice if hasattr(torch._C, "_cuda_getDevice") else torch.cuda.current_device


def launch_on_device(kernel: "LoadedKernel", device_index: int, stream: int, config: Any, args_address: int) -> None:
    """Launch `kernel` for tensors on `device_index`.

    A stream handle names its device, but the legacy default stream (handle 0) means "the current
    context": then the launch must run with the tensors' device current.
    """
    if stream == 0 and _current_device() != device_index:
        with torch.cuda.device(device_index):
            kernel.launch(config, args_address, device_index)
    else:
        kernel.launch(config, args_address, device_index)


# The capture status of the current device's current stream, straight from the C binding (torch.cuda's wrapper
# is this plus a Python call); False without initializing a context on a device that has none.
_current_stream_capturing = torch._C._cuda_isCurrentStreamCapturing if hasattr(
    torch._C, "_cuda_isCurrentStreamCapturing") else torch.cuda.is_current_stream_capturing


def stream_capturing(device_index: int) -> bool:
    """Whether the current stream of `device_index` (the one a launch for tensors on that device runs on) is being
    captured into a CUDA graph. torch's own check looks at the current device's stream only, so a device other than
    the current one is made current for the query and restored (a device switch each way, only for tensors off the
    current device). Capture status changes at any time: nothing here is cached but the bindings."""
    if _current_device() == device_index:
        return _current_stream_capturing()
    with torch.cuda.device(device_index):
        return _current_stream_capturing()


def refuse_during_capture(what: str, device_index: int | None = None) -> None:
    """Compiling or loading a module cannot be captured into a CUDA graph: GraphCaptureError when the current
    device's current stream, or that of `device_index` (the device of the tensors the kernel is for), is capturing.
    Cold path only (a compile or load follows)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return  # no CUDA context in this process: nothing can be capturing
    current = _current_device()
    if _current_stream_capturing() or (device_index is not None and device_index != current
                                       and stream_capturing(device_index)):
        on = "" if device_index is None else f" (tensors on cuda:{device_index})"
        raise GraphCaptureError(
            f"{what}{on} is not compiled/loaded yet and a CUDA graph is being captured; "
            "run this shape once eagerly (or call the precompile/warm-up API) before capturing"
        )


_primary_contexts: dict[int, Any] = {}


def _primary_context(device_index: int) -> Any:
    """The device's primary context (shared with torch), retained once per process."""
    context = _primary_contexts.get(device_index)
    if context is None:
        cu = driver()
        check(cu.cuInit(0), "cuInit")
        context = _primary_contexts.setdefault(
            device_index, check(cu.cuDevicePrimaryCtxRetain(cu.CUdevice(device_index)), "cuDevicePrimaryCtxRetain"))
    return context


class LoadedKernel:
    """One kernel from a cubin, loaded context-independently (cuLibrary) and launchable on any device."""

    def __init__(self, cubin: bytes, entry: str, dynamic_smem_bytes: int) -> None:
        cu = driver()
        self.entry = entry
        self.dynamic_smem_bytes = dynamic_smem_bytes
        self.library = check(cu.cuLibraryLoadData(cubin, None, None, 0, None, None, 0), "cuLibraryLoadData")
        self.kernel = check(cu.cuLibraryGetKernel(self.library, entry.encode()), f"cuLibraryGetKernel({entry})")
        self._launch_ex = cu.cuLaunchKernelEx
        self._success = cu.CUresult.CUDA_SUCCESS
        self._lock = threading.Lock()
        self._launch_configs: dict[tuple[int, int, tuple[int, int], int, int], Any] = {}
        self._ready_devices: set[int] = set()

    def _prepare_device(self, device_index: int) -> None:
        cu = driver()
        if self.dynamic_smem_bytes > 48 * 1024:
            check(
                cu.cuKernelSetAttribute(
                    cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    self.dynamic_smem_bytes,
                    self.kernel,
                    cu.CUdevice(device_index),
                ),
                "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )
        self._ready_devices.add(device_index)

    def max_active_clusters(self, device_index: int, block: int, cluster: int) -> int:
        """How many clusters of `cluster` CTAs can be resident at once (GPCs may leave SMs unpaired)."""
        cu = driver()
        with self._lock:
            if device_index not in self._ready_devices:
                self._prepare_device(device_index)
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes = self.dynamic_smem_bytes
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster, 1, 1
        config.attrs = [attribute]
        config.numAttrs = 1
        # cuKernelGetFunction resolves against the current context: make the device's primary context
        # (the one torch uses) current, so this also works before the caller has touched CUDA.
        check(cu.cuCtxPushCurrent(_primary_context(device_index)), "cuCtxPushCurrent")
        try:
            function = check(cu.cuKernelGetFunction(self.kernel), "cuKernelGetFunction")
            return int(check(cu.cuOccupancyMaxActiveClusters(function, config), "cuOccupancyMaxActiveClusters"))
        finally:
            cu.cuCtxPopCurrent()  # not checked: an error here must not hide the one being raised

    def launch_config(self, device_index: int, stream: int, grid: int, block: int, cluster: int = 1) -> Any:
        """A CUlaunchConfig per (device, stream, grid, block, cluster), built once and never mutated."""
        return self.launch_config_2d(device_index, stream, (grid, 1), block, cluster)

    def launch_config_2d(self, device_index: int, stream: int, grid: tuple[int, int], block: int, cluster: int = 1) -> Any:
        key = (device_index, stream, grid, block, cluster)
        config = self._launch_configs.get(key)
        if config is not None:
            return config
        with self._lock:
            if len(self._launch_configs) >= 4096:
                self._launch_configs.clear()
            if device_index not in self._ready_devices:
                self._prepare_device(device_index)
            cu = driver()
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid[0], grid[1], 1
            config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
            config.sharedMemBytes = self.dynamic_smem_bytes
            config.hStream = cu.CUstream(stream)
            if cluster > 1:
                attribute = cu.CUlaunchAttribute()
                attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster, 1, 1
                config.attrs = [attribute]
                config.numAttrs = 1
            else:
                config.numAttrs = 0
            self._launch_configs[key] = config
        return config

    def launch(self, config: Any, args_address: int, device_index: int | None = None) -> None:
        err, = self._launch_ex(config, self.kernel, args_address, 0)
        if err != self._success:
            if err == driver().CUresult.CUDA_ERROR_INVALID_CONTEXT and device_index is not None:
                # A thread whose first CUDA work is ours has no current context yet (torch makes one current
                # lazily): bind the device's primary context, torch's own, and launch again.
                check(driver().cuCtxSetCurrent(_primary_context(device_index)), "cuCtxSetCurrent")
                err, = self._launch_ex(config, self.kernel, args_address, 0)
            check((err,), f"cuLaunchKernelEx({self.entry})")
