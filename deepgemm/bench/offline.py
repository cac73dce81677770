"""What ``bench`` does without a GPU: compile (NVRTC) the kernels each shape would use, show their configs,
and predict their time from the roofline of a GPU spec."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deepgemm.api import bf16 as api_bf16
from deepgemm.api import gemm as api_gemm
from deepgemm.analysis.gpus import GpuSpec, Precision
from deepgemm.analysis.roofline import Ceilings, RooflineEstimate, estimate
from deepgemm.bench.peers import bf16_bytes, fp8_blockwise_bytes
from deepgemm.bench.suites import Shape, format_shape

_PRECOMPILERS = {"fp8": "precompile_fp8_gemm_nt"}
_SHOWN_CONFIG_FIELDS = ("block_m", "block_n", "block_k", "num_stages", "num_sms", "num_math_warpgroups")


class Progress(Protocol):
    """console.track's shape: iterate over the shapes, reporting each (with ``outcome``, once it is done)."""

    def __call__(self, items: Sequence[Shape], description: str, label: Callable[[Shape], str], *,
                 outcome: Callable[[Shape], str] | None = None) -> Iterator[Shape]: ...


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
    cached: bool = False  # the kernel came from the disk cache (or this process's memo): nothing was compiled
    failed: bool = False  # deepgemm refused the shape or could not compile its kernel (error says why)

    def config_cells(self) -> list[str]:
        """tile, stages, math warpgroups, registers, spills, and "cached" or the compile time."""
        if self.config is None:
            return ["-", "", "", "", "", ""]
        c = self.config
        tile = f"{c.get('block_m', '?')}x{c.get('block_n', '?')}x{c.get('block_k', '?')}"
        registers = spills = "-"
        if self.resources is not None:
            registers = str(self.resources.registers)
            spills = f"{self.resources.spill_stores}/{self.resources.spill_loads}"
        return [tile, str(c.get("num_stages", "?")), str(c.get("num_math_warpgroups", "?")), registers, spills,
                self.compile_cell()]

    def compile_cell(self) -> str:
        if self.cached:
            return "cached"
        return f"{self.compile_seconds:.2f} s" if self.compile_seconds is not None else "-"

    def outcome(self) -> str:
        """What compiling this shape's kernel did, for a progress line: cached, compiled (and how long) or failed."""
        if self.failed:
            return f"failed: {self.error}"
        if self.cached:
            return "cached"
        return f"compiled in {self.compile_seconds:.2f} s" if self.compile_seconds is not None else "not compiled"

    def other_config(self) -> str:
        """The config fields the table's columns do not show, or why no kernel was compiled for this shape."""
        if self.config is None:
            return self.error or ""
        return ", ".join(f"{k}={v}" for k, v in self.config.items() if k not in _SHOWN_CONFIG_FIELDS)


def find_precompiler(precision: Precision, layout: str = "nt") -> tuple[Callable[..., Any] | None, str]:
    """deepgemm's precompile function for ``precision`` (BF16: in ``layout``), called as f(m, n, k, num_sms=...,
    gpu=...), or None and the reason it is missing."""
    if precision == "bf16":
        return functools.partial(api_bf16.precompile_bf16_gemm, layout), ""
    name = _PRECOMPILERS[precision]
    function = getattr(api_gemm, name, None)
    if function is None:
        return None, f"kernel not available: deepgemm.api.gemm.{name} does not exist yet"
    return function, ""


def plan_shapes(shapes: Sequence[Shape], precision: Precision, gpu: GpuSpec, *, compile_kernels: bool,
                progress: Progress, layout: str = "nt") -> tuple[list[OfflinePlan], str]:
    """Roofline predictions for every shape, plus the compiled config where a kernel can be built.

    Returns the plans and a note ("" when kernels were compiled) saying why none were.
    """
    ceilings = Ceilings.from_spec(gpu)
    precompile, missing = find_precompiler(precision, layout) if compile_kernels else (None, "compilation skipped")
    plans: list[OfflinePlan] = []
    steps = (progress(list(shapes), "predicting", format_shape) if precompile is None else
             progress(list(shapes), "kernel", format_shape, outcome=lambda _shape: plans[-1].outcome()))
    for shape in steps:
        m, n, k = shape
        flops = 2 * m * n * k
        num_bytes = fp8_blockwise_bytes(m, n, k) if precision == "fp8" else bf16_bytes(m, n, k)
        prediction = estimate(flops, num_bytes, precision, ceilings)
        plan = OfflinePlan(shape, prediction, flops, num_bytes, error=missing or None)
        if precompile is not None:
            plan = _compiled(plan, precompile, gpu)
        elif gpu.runs_sm90a:  # nothing compiled: the shape still meets deepgemm's rules, or its row says why not
            plan = _checked(plan, shape_rules(precision, layout), gpu)
        plans.append(plan)
    return plans, missing


def shape_rules(precision: Precision, layout: str = "nt") -> Callable[..., None]:
    """The argument rules of ``precision``'s precompile function (BF16: in ``layout``), called alike; no compiling."""
    if precision == "bf16":
        return functools.partial(api_bf16.check_precompile_bf16_shape, layout)
    return api_gemm.check_precompile_shape


def _checked(plan: OfflinePlan, rules: Callable[..., None], gpu: GpuSpec) -> OfflinePlan:
    try:
        rules(*plan.shape, num_sms=gpu.num_sms)
    except Exception as exc:  # noqa: BLE001 - one shape's refusal is reported in its row
        return _failed(plan, exc)
    return plan


def _failed(plan: OfflinePlan, exc: Exception) -> OfflinePlan:
    """The plan with the error's type and first line, marked failed."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return dataclasses.replace(plan, error=f"{type(exc).__name__}: {first_line[:160]}", failed=True)


def _compiled(plan: OfflinePlan, precompile: Callable[..., Any], gpu: GpuSpec) -> OfflinePlan:
    """The kernel a call on `gpu` loads: planned for its SM count with its tuned table."""
    try:
        info = precompile(*plan.shape, num_sms=gpu.num_sms, gpu=gpu.device_name)
    except Exception as exc:  # noqa: BLE001 - one shape's failure is reported in its row
        return _failed(plan, exc)
    config = dataclasses.asdict(info.config)
    for name in ("block_k", "num_math_warpgroups"):  # properties of some configs
        value = getattr(info.config, name, None)
        if value is not None and name not in config:
            config[name] = value
    return dataclasses.replace(plan, config=config, resources=info.resources, compile_seconds=info.compile_seconds,
                               cached=bool(getattr(info, "cached", False)))
