"""Regression check: the current results against a stored baseline, shape by shape.

By default a row compares absolute times (baseline us / current us). With ``relative_to`` it compares each
implementation's same-run speed ratio to a peer (peer us / impl us in one results file), current over baseline, so
that a host uniformly faster or slower than the baseline's cancels out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deepgemm.bench.results import BenchResults, Measurement
from deepgemm.bench.suites import Shape, format_shape

Verdict = Literal["ok", "improved", "regressed", "broken", "inaccurate", "fixed", "missing", "n/a"]
FAILING: frozenset[Verdict] = frozenset({"regressed", "broken", "inaccurate"})
Peer = tuple[str, Measurement | None, Measurement | None]  # --relative-to: name, baseline and current of a shape


@dataclass(frozen=True)
class Row:
    shape: Shape
    impl: str
    verdict: Verdict
    ratio: float | None  # baseline time / current time (or, relative, current / baseline ratio): > 1 is faster now
    baseline_us: float | None
    current_us: float | None
    detail: str = ""
    relative_baseline: float | None = None  # with relative_to: peer us / impl us in the baseline
    relative_current: float | None = None  # ... and in the current results


@dataclass(frozen=True)
class Comparison:
    rows: tuple[Row, ...]
    fail_below: float
    notes: tuple[str, ...] = ()
    relative_to: str | None = None  # the peer the speed ratios are taken to; None: absolute times

    @property
    def measure(self) -> str:
        """What a ratio is a fraction of, for the verdict line and the table's title."""
        if self.relative_to is None:
            return "baseline speed"
        return f"the baseline's speed relative to {self.relative_to}"

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
            peer = f", with {self.relative_to}," if self.relative_to else ""
            return f"NOTHING COMPARED: no shape was measured{peer} in both the baseline and this run"
        geomean = math.exp(sum(math.log(r) for r in ratios) / compared) if compared else float("nan")
        if failures:
            names = ", ".join(f"{format_shape(r.shape)} {r.impl} ({r.verdict})" for r in failures[:5])
            more = f" and {len(failures) - 5} more" if len(failures) > 5 else ""
            return (f"FAIL: {len(failures)} of {len(self.rows)} checks failed (threshold {self.fail_below:.2f}x of "
                    f"{self.measure}): {names}{more}")
        worst = min((row for row in self.rows if row.ratio is not None), key=lambda row: row.ratio or 0.0)
        return (f"PASS: {compared} shapes at or above {self.fail_below:.2f}x of {self.measure} "
                f"(geomean {geomean:.3f}x, worst {worst.ratio:.3f}x at {format_shape(worst.shape)} {worst.impl})")


def gated_implementations(baseline: BenchResults, requested: Sequence[str] | None,
                          relative_to: str | None = None) -> list[str]:
    """The implementations whose speed gates the verdict: ``requested``, else baseline's deepgemm ones; never the
    ``relative_to`` peer (its ratio to itself is always 1), which must be in the baseline."""
    names = baseline.impl_names()
    if relative_to is not None and relative_to not in names:
        raise ValueError(f"argument --relative-to: {relative_to} not in the baseline (it has: {', '.join(names)})")
    if requested:
        unknown = [name for name in requested if name not in names]
        if unknown:
            raise ValueError(f"argument --gate: {', '.join(unknown)} not in the baseline (it has: {', '.join(names)})")
        gated = [name for name in requested if name != relative_to]
        if not gated:
            raise ValueError(f"argument --relative-to: --gate names only {relative_to}, the peer itself; gate "
                             f"another implementation (the baseline has: {', '.join(names)})")
        return gated
    deepgemm = [name for name in names if name.startswith("deepgemm")]
    if not deepgemm:
        raise ValueError(f"argument --compare: the baseline has no deepgemm measurements; choose what gates with "
                         f"--gate (it has: {', '.join(names)})")
    if deepgemm == [relative_to]:
        raise ValueError(f"argument --relative-to: {relative_to} is the baseline's only deepgemm implementation; "
                         f"choose what gates with --gate (it has: {', '.join(names)})")
    return [name for name in deepgemm if name != relative_to]


def compare(baseline: BenchResults, current: BenchResults, *, fail_below: float = 0.95,
            gate: Sequence[str] | None = None, relative_to: str | None = None) -> Comparison:
    """Judge each baseline shape and gated implementation; ``relative_to`` names the peer whose same-run ratios
    are compared instead of absolute times."""
    if not 0 < fail_below <= 1:
        raise ValueError(f"argument --fail-below: must be in (0, 1], got {fail_below}")
    impls = gated_implementations(baseline, gate, relative_to)
    rows: list[Row] = []
    for shape in baseline.shapes():
        peer = (None if relative_to is None
                else (relative_to, baseline.find(shape, relative_to), current.find(shape, relative_to)))
        rows.extend(_judge(shape, impl, baseline.find(shape, impl), current.find(shape, impl), fail_below, peer)
                    for impl in impls)
    notes = []
    old, new = baseline.environment.get("device"), current.environment.get("device")
    if old and new and old != new:
        compared = "ratios" if relative_to is None else f"same-run ratios to {relative_to}"
        notes.append(f"baseline was measured on {old}, this run on {new}: {compared} compare different GPUs")
    old_layout, new_layout = (results.settings.get("layout", "nt") for results in (baseline, current))
    if old_layout != new_layout:
        notes.append(f"baseline ran --layout {old_layout}, this run --layout {new_layout}: ratios compare different "
                     "operand layouts")
    old_flush, new_flush = (results.settings.get("flush_mode", "zero") for results in (baseline, current))
    if old_flush != new_flush:
        notes.append(f"baseline flushed L2 with --flush {old_flush}, this run with --flush {new_flush}: decode-size "
                     "times differ by the write-back of the zeroing flush's dirty lines")
    return Comparison(tuple(rows), fail_below, tuple(notes), relative_to)


def _judge(shape: Shape, impl: str, old: Measurement | None, new: Measurement | None, fail_below: float,
           peer: Peer | None = None) -> Row:
    """One row's verdict: on absolute times, or with ``peer`` on the same-run speed ratios to it."""
    rel_old = _speed_ratio(old, peer[1]) if peer else None
    rel_new = _speed_ratio(new, peer[2]) if peer else None

    def row(verdict: Verdict, ratio: float | None = None, detail: str = "") -> Row:
        return Row(shape, impl, verdict, ratio, old.median_us if old else None, new.median_us if new else None,
                   detail, rel_old, rel_new)

    if old is None or not old.ok:
        if new is not None and new.ok:
            return row("fixed", detail="runs now; was not measured in the baseline")
        return row("n/a", detail="not measured in the baseline")
    if new is None:
        return row("missing", detail="not run this time")
    if not new.ok:
        return row("broken", detail=f"{new.status}: {new.reason}")
    if peer is None:
        ratio: float | None = old.median_us / new.median_us  # type: ignore[operator]
    else:
        ratio = rel_new / rel_old if rel_new is not None and rel_old is not None else None
    if not new.accurate:  # wrong results fail whether or not the peer gives a ratio
        return row("inaccurate", ratio, f"calc_diff {new.calc_diff}")
    if ratio is None:  # only a relative ratio can be missing: a file lacks the peer's time
        assert peer is not None
        return row("n/a", detail=_peer_gap(*peer))
    if ratio < fail_below:
        return row("regressed", ratio)
    return row("improved" if ratio >= 1 / fail_below else "ok", ratio)


def _speed_ratio(impl: Measurement | None, peer: Measurement | None) -> float | None:
    """peer time / impl time in one results file (> 1: impl is faster), when both ran."""
    if impl is None or peer is None or not impl.ok or not peer.ok:
        return None
    return peer.median_us / impl.median_us  # type: ignore[operator]


def _peer_gap(peer: str, old: Measurement | None, new: Measurement | None) -> str:
    """Which file lacks a time of the peer (and why, where the file says)."""
    lacking = [f"{where}{_why(m)}" for where, m in (("the baseline", old), ("this run", new))
               if m is None or not m.ok]
    return f"no {peer} time in {' nor '.join(lacking)}"


def _why(m: Measurement | None) -> str:
    if m is None:
        return " (not measured)"
    return f" ({m.status}: {m.reason})" if m.reason else f" ({m.status})"
