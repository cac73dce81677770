"""What ``bench`` prints and writes without a GPU: the kernels' table, its summary line, and the plan as JSON
(format ``deepgemm-bench-plan``) and Markdown."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deepgemm.analysis.gpus import GpuSpec
from deepgemm.analysis.units import micros
from deepgemm.bench.offline import OfflinePlan
from deepgemm.bench.suites import format_shape

FORMAT = "deepgemm-bench-plan"
VERSION = 1
HEADERS = ("shape (MxNxK)", "tile", "stages", "WGs", "regs", "spills", "compile", "roofline us", "TFLOPS", "bound",
           "other config")
OTHER_CONFIG = HEADERS.index("other config")  # folded below the table when it does not fit
TFLOPS = HEADERS.index("TFLOPS")  # the first column left out when the table does not fit
LEGEND = ("WGs: math warpgroups; regs: registers per thread; spills: stores/loads; compile: NVRTC's time, or "
          "cached; TFLOPS: at the roof")


def rows(plans: Sequence[OfflinePlan]) -> list[list[str]]:
    return [[format_shape(plan.shape), *plan.config_cells(), micros(plan.prediction.time_s),
             f"{plan.flops / plan.prediction.time_s / 1e12:,.0f}", plan.prediction.bound, _other(plan)]
            for plan in plans]


def _other(plan: OfflinePlan) -> str:
    """The config fields the other columns do not show (a shape that failed has none: its error is listed apart)."""
    return plan.other_config() if plan.config is not None else ""


def summary_line(plans: Sequence[OfflinePlan], precision: str, gpu: GpuSpec) -> str:
    """One line: how many kernels were compiled, cached or failed, and the predicted total on the roofline."""
    total_s = sum(plan.prediction.time_s for plan in plans)
    built = [plan for plan in plans if plan.config is not None]
    cached = sum(plan.cached for plan in built)
    failed = sum(plan.failed for plan in plans)
    kernels = (f"{len(built) - cached} compiled, {cached} from cache, {failed} failed" if built or failed
               else "no kernels compiled")
    shapes = f"{len(plans)} {precision} shape{'' if len(plans) == 1 else 's'}"
    return (f"summary: {shapes} for {gpu.name} ({gpu.num_sms} SMs): {kernels}; "
            f"roofline total {micros(total_s)} us")


def plan_document(plans: Sequence[OfflinePlan], precision: str, gpu: GpuSpec, note: str) -> dict[str, Any]:
    """The JSON form: the GPU spec and, per shape, the kernel's config, resources and roofline prediction."""
    return {
        "format": FORMAT, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "gpu": {"key": gpu.key, "name": gpu.name, "num_sms": gpu.num_sms}, "precision": precision,
        "note": note or None,
        "shapes": [_shape_json(plan) for plan in plans],
    }


def _shape_json(plan: OfflinePlan) -> dict[str, Any]:
    m, n, k = plan.shape
    resources = plan.resources
    return {
        "m": m, "n": n, "k": k, "config": plan.config,
        "registers": resources.registers if resources is not None else None,
        "spill_stores": resources.spill_stores if resources is not None else None,
        "spill_loads": resources.spill_loads if resources is not None else None,
        "compile": "failed" if plan.failed else "cached" if plan.cached else
                   "compiled" if plan.config is not None else "skipped",
        "compile_seconds": plan.compile_seconds, "error": plan.error if plan.failed else None,
        "flops": plan.flops, "bytes": plan.bytes, "roofline_us": plan.prediction.time_s * 1e6,
        "bound": plan.prediction.bound,
    }


def plan_markdown(plans: Sequence[OfflinePlan], precision: str, gpu: GpuSpec, note: str) -> str:
    lines = [f"# deepgemm kernels and roofline predictions ({precision}, {gpu.name}, {gpu.num_sms} SMs)", "",
             "No GPU: nothing was timed. Kernels compiled with NVRTC for sm_90a; times are the datasheet roofline.",
             ""]
    if note:
        lines += [f"- {note}", ""]
    lines += ["| " + " | ".join(HEADERS) + " |",
              "|" + "|".join("---" if i in (0, 1, OTHER_CONFIG) else "---:" for i in range(len(HEADERS))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows(plans)]
    failed = [plan for plan in plans if plan.failed]
    if failed:
        lines += ["", "## Failed", ""] + [f"- {format_shape(plan.shape)}: {plan.error}" for plan in failed]
    lines += ["", LEGEND, "", summary_line(plans, precision, gpu)]
    return "\n".join(lines) + "\n"


def save_plan(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
