"""Regression check: the current results against a stored baseline, shape by shape."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deepgemm.bench.results import BenchResults, Measurement
from deepgemm.bench.suites import Shape, format_shape

Verdict = Literal["ok", "improved", "regressed", "broken", "inaccurate", "fixed", "missing", "n/a"]
FAILING: frozenset[Verdict] = frozenset({"regressed", "broken", "inaccurate"})


@dataclass(frozen=True)
class Row:
    shape: Shape
    impl: str
    verdict: Verdict
    ratio: float | None  # baseline time / current time: > 1 is faster now
    baseline_us: float | None
    current_us: float | None
    detail: str = ""


@dataclass(frozen=True)
class Comparison:
    rows: tuple[Row, ...]
    fail_below: float
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return any(row.verdict in FAILING for row in self.rows)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def verdict_line(self) -> str:
        ratios = [row.ratio for row in self.rows if row.ratio is not None]
        compared = len(ratios)
        failures = [row for row in self.rows if row.verdict in FAILING]
        if not compared and not failures:
            return "NOTHING COMPARED: no shape was measured in both the baseline and this run"
        geomean = math.exp(sum(math.log(r) for r in ratios) / compared) if compared else float("nan")
        if failures:
            names = ", ".join(f"{format_shape(r.shape)} {r.impl} ({r.verdict})" for r in failures[:5])
            more = f" and {len(failures) - 5} more" if len(failures) > 5 else ""
            return (f"FAIL: {len(failures)} of {len(self.rows)} checks failed (threshold {self.fail_below:.2f}x of "
                    f"baseline speed): {names}{more}")
        worst = min((row for row in self.rows if row.ratio is not None), key=lambda row: row.ratio or 0.0)
        return (f"PASS: {compared} shapes at or above {self.fail_below:.2f}x of baseline speed "
                f"(geomean {geomean:.3f}x, worst {worst.ratio:.3f}x at {format_shape(worst.shape)} {worst.impl})")


def gated_implementations(baseline: BenchResults, requested: Sequence[str] | None) -> list[str]:
    """The implementations whose speed gates the verdict: ``requested``, else baseline's deepgemm ones."""
    names = baseline.impl_names()
    if requested:
        unknown = [name for name in requested if name not in names]
        if unknown:
            raise ValueError(f"argument --gate: {', '.join(unknown)} not in the baseline (it has: {', '.join(names)})")
        return list(requested)
    gated = [name for name in names if name.startswith("deepgemm")]
    if not gated:
        raise ValueError(f"argument --compare: the baseline has no deepgemm measurements; choose what gates with "
                         f"--gate (it has: {', '.join(names)})")
    return gated


def compare(baseline: BenchResults, current: BenchResults, *, fail_below: float = 0.95,
            gate: Sequence[str] | None = None) -> Comparison:
    if not 0 < fail_below <= 1:
        raise ValueError(f"argument --fail-below: must be in (0, 1], got {fail_below}")
    impls = gated_implementations(baseline, gate)
    rows = tuple(_judge(shape, impl, baseline.find(shape, impl), current.find(shape, impl), fail_below)
                 for shape in baseline.shapes() for impl in impls)
    notes = []
    old, new = baseline.environment.get("device"), current.environment.get("device")
    if old and new and old != new:
        notes.append(f"baseline was measured on {old}, this run on {new}: ratios compare different GPUs")
    old_layout, new_layout = (results.settings.get("layout", "nt") for results in (baseline, current))
    if old_layout != new_layout:
        notes.append(f"baseline ran --layout {old_layout}, this run --layout {new_layout}: ratios compare different "
                     "operand layouts")
    return Comparison(rows, fail_below, tuple(notes))


def _judge(shape: Shape, impl: str, old: Measurement | None, new: Measurement | None, fail_below: float) -> Row:
    def row(verdict: Verdict, ratio: float | None = None, detail: str = "") -> Row:
        return Row(shape, impl, verdict, ratio, old.median_us if old else None, new.median_us if new else None,
                   detail)

    if old is None or not old.ok:
        if new is not None and new.ok:
            return row("fixed", detail="runs now; was not measured in the baseline")
        return row("n/a", detail="not measured in the baseline")
    if new is None:
        return row("missing", detail="not run this time")
    if not new.ok:
        return row("broken", detail=f"{new.status}: {new.reason}")
    ratio = old.median_us / new.median_us  # type: ignore[operator]
    if not new.accurate:
        return row("inaccurate", ratio, f"calc_diff {new.calc_diff}")
    if ratio < fail_below:
        return row("regressed", ratio)
    return row("improved" if ratio >= 1 / fail_below else "ok", ratio)
