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


# A kernel's launch configs: (plain, programmatic). The programmatic one carries the programmatic-stream-
# serialization attribute (programmatic dependent launch): the kernel may start while the previous kernel in its
# stream drains. Every kernel of ours waits on `griddepcontrol.wait` before its first global access, so that only
# overlaps its prologue (barrier setup, descriptor prefetch) with the previous kernel's tail.
LaunchConfigs = tuple[Any, Any]


class _Pdl:
    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = False


_pdl = _Pdl()


def set_pdl(enabled: bool) -> None:
    """Launch deepgemm's kernels with programmatic dependent launch (PDL) from now on, or plainly (the default).

    With PDL a kernel of ours may start while the kernel before it in the stream is still finishing: the GEMMs set
    up their shared-memory barriers and prefetch their TMA descriptors, then every kernel waits
    (`griddepcontrol.wait`) until that kernel has completed and its writes are visible, before it reads or writes
    global memory. Results are the same either way; what PDL can save is the gap between consecutive kernels
    (their launch latency, and the GEMMs' prologue), e.g. between the activation quantizer and its GEMM. Our kernels
    also let a PDL-launched successor start early (`griddepcontrol.launch_dependents`: the quantizers right after
    their wait, the GEMMs once each CTA has issued its last load); such a successor must itself wait before reading
    our output, as PDL requires of every kernel launched with it.

    The setting is process-wide and read at every launch, the tuner's timing launches included; a CUDA graph
    captured while it is on keeps the programmatic edges between consecutive kernel nodes (CUDA 12.3 or newer).

    Args:
        enabled: True to launch with the programmatic-stream-serialization attribute, False to launch plainly.

    Raises:
        TypeError: `enabled` is not a bool.

    Example::

        deepgemm.set_pdl(True)
        a = deepgemm.quantize_per_token_group(x)   # the GEMM's launch overlaps the quantizer's tail
        y = deepgemm.fp8_gemm_nt(a, b)
    """
    if type(enabled) is not bool:
        raise TypeError(f"set_pdl: 'enabled' must be a bool, got {type(enabled).__name__}")
    _pdl.enabled = enabled


def get_pdl() -> bool:
    """Whether deepgemm's kernels launch with programmatic dependent launch (see set_pdl; False by default).

    Raises:
        Nothing.

    Example::

        if not deepgemm.get_pdl():
            deepgemm.set_pdl(True)
    """
    return _pdl.enabled


def build_launch_config(stream: int, grid: tuple[int, int], block: int, dynamic_smem_bytes: int, cluster: int,
                        programmatic: bool) -> Any:
    """A CUlaunchConfig: a 1D block, a 2D grid, `cluster` CTAs per cluster along x, and the programmatic-stream-
    serialization attribute when `programmatic`."""
    cu = driver()
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid[0], grid[1], 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes = dynamic_smem_bytes
    config.hStream = cu.CUstream(stream)
    attributes = []
    if cluster > 1:
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster, 1, 1
        attributes.append(attribute)
    if programmatic:
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        attributes.append(attribute)
    if attributes:
        config.attrs = attributes
    config.numAttrs = len(attributes)
    return config


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
        self._launch_configs: dict[tuple[int, int, tuple[int, int], int, int], LaunchConfigs] = {}
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
        config = build_launch_config(0, (cluster, 1), block, self.dynamic_smem_bytes, cluster, False)
        # cuKernelGetFunction resolves against the current context: make the device's primary context
        # (the one torch uses) current, so this also works before the caller has touched CUDA.
        check(cu.cuCtxPushCurrent(_primary_context(device_index)), "cuCtxPushCurrent")
        try:
            function = check(cu.cuKernelGetFunction(self.kernel), "cuKernelGetFunction")
            return int(check(cu.cuOccupancyMaxActiveClusters(function, config), "cuOccupancyMaxActiveClusters"))
        finally:
            cu.cuCtxPopCurrent()  # not checked: an error here must not hide the one being raised

    def launch_config(self, device_index: int, stream: int, grid: int, block: int, cluster: int = 1) -> LaunchConfigs:
        """The launch configs per (device, stream, grid, block, cluster), built once and never mutated."""
        return self.launch_config_2d(device_index, stream, (grid, 1), block, cluster)

    def launch_config_2d(self, device_index: int, stream: int, grid: tuple[int, int], block: int,
                         cluster: int = 1) -> LaunchConfigs:
        key = (device_index, stream, grid, block, cluster)
        configs = self._launch_configs.get(key)
        if configs is not None:
            return configs
        with self._lock:
            if len(self._launch_configs) >= 4096:
                self._launch_configs.clear()
            if device_index not in self._ready_devices:
                self._prepare_device(device_index)
            smem = self.dynamic_smem_bytes
            configs = (build_launch_config(stream, grid, block, smem, cluster, False),
                       build_launch_config(stream, grid, block, smem, cluster, True))
            self._launch_configs[key] = configs
        return configs

    def launch(self, configs: LaunchConfigs, args_address: int, device_index: int | None = None) -> None:
        """Launch with `configs`' programmatic form while set_pdl(True) holds, else its plain form."""
        config = configs[_pdl.enabled]
        err, = self._launch_ex(config, self.kernel, args_address, 0)
        if err != self._success:
            if err == driver().CUresult.CUDA_ERROR_INVALID_CONTEXT and device_index is not None:
                # A thread whose first CUDA work is ours has no current context yet (torch makes one current
                # lazily): bind the device's primary context, torch's own, and launch again.
                check(driver().cuCtxSetCurrent(_primary_context(device_index)), "cuCtxSetCurrent")
                err, = self._launch_ex(config, self.kernel, args_address, 0)
            check((err,), f"cuLaunchKernelEx({self.entry})")
