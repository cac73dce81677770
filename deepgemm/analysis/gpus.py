"""GPU specifications as data: the datasheet ceilings a roofline needs.

Throughputs are *dense* tensor-core peaks (the sparse figures NVIDIA also
quotes are twice these) at the boost clock of the SXM parts unless the name
says otherwise; bandwidth is the HBM datasheet figure in GB/s (10^9 bytes/s).
Measured ceilings are lower: on an H200 a device-to-device copy reaches about
4.3 TB/s and a bf16 8192^3 matmul about 800 TFLOPS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Precision = Literal["fp8", "bf16"]


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    num_sms: int
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores
    hbm_gbs: float
    memory_gib: float
    compute_capability: tuple[int, int]
    device_name: str | None = None  # as torch.cuda.get_device_name() spells it (Hopper parts: names a tuned table)

    @property
    def runs_sm90a(self) -> bool:
        """Whether deepgemm's kernels (sm_90a cubins, which run on compute capability 9.0 only) run on this GPU."""
        return self.compute_capability == (9, 0)

    @property
    def arch(self) -> str:
        return "sm_%d%d" % self.compute_capability


GPUS: dict[str, GpuSpec] = {
    spec.key: spec
    for spec in (
        GpuSpec("h100-sxm", "NVIDIA H100 SXM5", 132, 989.4, 1978.9, 3350.0, 80, (9, 0), "NVIDIA H100 80GB HBM3"),
        GpuSpec("h100-pcie", "NVIDIA H100 PCIe", 114, 756.0, 1513.0, 2000.0, 80, (9, 0), "NVIDIA H100 PCIe"),
        GpuSpec("h200", "NVIDIA H200 SXM", 132, 989.4, 1978.9, 4800.0, 141, (9, 0), "NVIDIA H200"),
        GpuSpec("h800", "NVIDIA H800 SXM5", 132, 989.4, 1978.9, 3350.0, 80, (9, 0), "NVIDIA H800"),
        GpuSpec("h20", "NVIDIA H20", 78, 148.0, 296.0, 4000.0, 96, (9, 0), "NVIDIA H20"),
        GpuSpec("a100", "NVIDIA A100 SXM4 80GB", 108, 312.0, None, 2039.0, 80, (8, 0)),
        GpuSpec("b200", "NVIDIA B200", 148, 2250.0, 4500.0, 8000.0, 180, (10, 0)),
    )
}

_ALIASES = {"h100": "h100-sxm", "h200-sxm": "h200", "a100-sxm": "a100", "h800-sxm": "h800"}

DEFAULT_GPU = "h200"


def get_gpu(name: str) -> GpuSpec:
    """Look a spec up by key or alias (case-insensitive); ValueError names the choices."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return GPUS[key]
    except KeyError:
        known = ", ".join(sorted(GPUS))
        raise ValueError(f"unknown GPU {name!r} (known: {known})") from None


def match_device_name(device_name: str) -> GpuSpec | None:
    """The spec whose marketing name fits ``torch.cuda.get_device_name()``, if any."""
    lowered = device_name.lower()
    for token, key in (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                       ("h800", "h800"), ("h20", "h20"), ("a100", "a100"), ("b200", "b200")):
        if token in lowered:
            return GPUS[key]
    return None
