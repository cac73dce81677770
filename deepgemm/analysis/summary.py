"""Roll GEMMs up into per-phase totals: FLOPs, bytes, roofline time, and where the time goes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from deepgemm.analysis.ops import GemmOp, Phase
from deepgemm.analysis.roofline import Ceilings, RooflineEstimate, estimate


@dataclass(frozen=True)
class OpEstimate:
    op: GemmOp
    per_call: RooflineEstimate

    @property
    def time_s(self) -> float:
        return self.per_call.time_s * self.op.count


@dataclass(frozen=True)
class PhaseSummary:
    phase: Phase
    estimates: tuple[OpEstimate, ...]

    @property
    def flops(self) -> int:
        return sum(e.op.flops for e in self.estimates)

    @property
    def bytes(self) -> int:
        return sum(e.op.bytes for e in self.estimates)

    @property
    def time_s(self) -> float:
        return sum(e.time_s for e in self.estimates)

    @property
    def memory_bound_time_s(self) -> float:
        return sum(e.time_s for e in self.estimates if e.per_call.bound == "memory")

    def share(self, estimate: OpEstimate) -> float:
        return estimate.time_s / self.time_s if self.time_s else 0.0

    def time_by_category(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for e in self.estimates:
            totals[e.op.category] += e.time_s
        return dict(totals)


def summarize(ops: list[GemmOp], ceilings: Ceilings) -> list[PhaseSummary]:
    """One summary per phase, in the order the phases first appear."""
    by_phase: dict[Phase, list[OpEstimate]] = {}
    for op in ops:
        by_phase.setdefault(op.phase, []).append(
            OpEstimate(op, estimate(op.flops_per_call, op.traffic.total, op.precision, ceilings)))
    return [PhaseSummary(phase, tuple(estimates)) for phase, estimates in by_phase.items()]


def summaries_to_dict(summaries: list[PhaseSummary]) -> list[dict[str, Any]]:
    """JSON-ready form: exact integer FLOPs and bytes, times in seconds."""
    return [
        {
            "phase": s.phase,
            "flops": s.flops,
            "bytes": s.bytes,
            "roofline_s": s.time_s,
            "memory_bound_s": s.memory_bound_time_s,
            "time_by_category_s": s.time_by_category(),
            "gemms": [
                {
                    "name": e.op.name, "pass": e.op.pass_, "category": e.op.category, "kind": e.op.kind,
                    "m": e.op.m, "n": e.op.n, "k": e.op.k, "batch": e.op.batch, "groups": e.op.groups,
                    "count": e.op.count, "precision": e.op.precision,
                    "flops": e.op.flops, "bytes": e.op.bytes,
                    "bytes_per_call": {"a": e.op.traffic.a, "b": e.op.traffic.b, "d": e.op.traffic.d,
                                       "scales": e.op.traffic.scales},
                    "intensity": e.op.intensity, "roofline_s": e.time_s, "bound": e.per_call.bound,
                    "share": s.share(e),
                }
                for e in s.estimates
            ],
        }
        for s in summaries
    ]
