"""What ``bench`` does without a GPU: compile (NVRTC) the kernels each shape would use, show their configs,
and predict their time from the roofline of a GPU spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deepgemm.api import gemm as api_gemm
from deepgemm.analysis.gpus import GpuSpec, Precision
from deepgemm.analysis.roofline import Ceilings, RooflineEstimate, estimate
from deepgemm.bench.peers import bf16_bytes, fp8_blockwise_bytes
from deepgemm.bench.runner import Progress
from deepgemm.bench.suites import Shape, format_shape

_PRECOMPILERS = {"fp8": "precompile_fp8_gemm_nt", "bf16": "precompile_bf16_gemm_nt"}
_SHOWN_CONFIG_FIELDS = ("block_m", "block_n", "block_k", "num_stages", "num_sms", "num_math_warpgroups")


@dataclass(frozen=True)
class OfflinePlan:
    shape: Shape
    prediction: RooflineEstimate
    flops: int
    bytes: int
    config: dict[str, Any] | None = None
    resources: Any = None
    compile_seconds: float | None = None
    error: str | None = None  # why nothing was compiled for this shape

    def config_cells(self) -> list[str]:
        """tile, stages, math warpgroups, other fields, registers, spills, compile seconds."""
        if self.config is None:
            return [self.error or "-", "", "", "", "", "", ""]
        c = self.config
        tile = f"{c.get('block_m', '?')}x{c.get('block_n', '?')}x{c.get('block_k', '?')}"
        others = ", ".join(f"{k}={v}" for k, v in c.items() if k not in _SHOWN_CONFIG_FIELDS)
        registers = spills = "-"
        if self.resources is not None:
            registers = str(self.resources.registers)
            spills = f"{self.resources.spill_stores}/{self.resources.spill_loads}"
        return [tile, str(c.get("num_stages", "?")), str(c.get("num_math_warpgroups", "?")), others, registers,
                spills, f"{self.compile_seconds:.2f}" if self.compile_seconds is not None else "-"]


def find_precompiler(precision: Precision) -> tuple[Callable[..., Any] | None, str]:
    """deepgemm's precompile function for ``precision``, or None and the reason it is missing."""
    name = _PRECOMPILERS[precision]
    function = getattr(api_gemm, name, None)
    if function is None:
        return None, f"kernel not available: deepgemm.api.gemm.{name} does not exist yet"
    return function, ""


def plan_shapes(shapes: Sequence[Shape], precision: Precision, gpu: GpuSpec, *, compile_kernels: bool,
                progress: Progress) -> tuple[list[OfflinePlan], str]:
    """Roofline predictions for every shape, plus the compiled config where a kernel can be built.

    Returns the plans and a note ("" when kernels were compiled) saying why none were.
    """
    ceilings = Ceilings.from_spec(gpu)
    precompile, missing = find_precompiler(precision) if compile_kernels else (None, "compilation skipped")
    plans = []
    for shape in progress(list(shapes), "compiling" if precompile else "predicting", format_shape):
        m, n, k = shape
        flops = 2 * m * n * k
        num_bytes = fp8_blockwise_bytes(m, n, k) if precision == "fp8" else bf16_bytes(m, n, k)
        prediction = estimate(flops, num_bytes, precision, ceilings)
        plan = OfflinePlan(shape, prediction, flops, num_bytes, error=missing or None)
        if precompile is not None:
            plan = _compiled(plan, precompile, gpu.num_sms)
        plans.append(plan)
    return plans, missing


def _compiled(plan: OfflinePlan, precompile: Callable[..., Any], num_sms: int) -> OfflinePlan:
    try:
        info = precompile(*plan.shape, num_sms=num_sms)
    except Exception as exc:  # noqa: BLE001 - one shape's failure is reported in its row
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return dataclasses.replace(plan, error=f"{type(exc).__name__}: {first_line[:160]}")
    config = dataclasses.asdict(info.config)
    warpgroups = getattr(info.config, "num_math_warpgroups", None)
    if warpgroups is not None:
        config["num_math_warpgroups"] = warpgroups
    return dataclasses.replace(plan, config=config, resources=info.resources, compile_seconds=info.compile_seconds)
