"""Roofline model: the time a kernel needs at best, given its FLOPs and bytes and the GPU's ceilings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from deepgemm.analysis.gpus import GpuSpec, Precision

Bound = Literal["compute", "memory"]


@dataclass(frozen=True)
class Ceilings:
    """Peak throughputs a roofline is drawn against (TFLOPS = 10^12 FLOP/s, GB/s = 10^9 B/s)."""

    bf16_tflops: float
    fp8_tflops: float | None
    bandwidth_gbs: float
    source: str  # "datasheet <gpu>" or "measured on <device>"

    @classmethod
    def from_spec(cls, spec: GpuSpec) -> Ceilings:
        return cls(spec.bf16_tflops, spec.fp8_tflops, spec.hbm_gbs, f"datasheet {spec.name}")

    def tflops(self, precision: Precision) -> float:
        if precision == "bf16":
            return self.bf16_tflops
        if self.fp8_tflops is None:
            raise ValueError(f"no FP8 peak for this GPU ({self.source}); use --dtype bf16")
        return self.fp8_tflops

    def ridge_intensity(self, precision: Precision) -> float:
        """FLOP/byte where the memory roof meets the compute roof."""
        return self.tflops(precision) * 1e12 / (self.bandwidth_gbs * 1e9)

    def attainable_tflops(self, intensity: float, precision: Precision) -> float:
        return min(self.tflops(precision), intensity * self.bandwidth_gbs / 1e3)


@dataclass(frozen=True)
class RooflineEstimate:
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> Bound:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def estimate(flops: int | float, num_bytes: int | float, precision: Precision, ceilings: Ceilings) -> RooflineEstimate:
    return RooflineEstimate(
        compute_s=flops / (ceilings.tflops(precision) * 1e12),
        memory_s=num_bytes / (ceilings.bandwidth_gbs * 1e9),
    )
