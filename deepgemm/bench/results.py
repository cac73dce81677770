"""The benchmark results file: a versioned JSON document (format "deepgemm-bench", version 1).

docs/cli.md documents every field. Derived numbers (TFLOPS, GB/s, speedups, roofline fraction) are
written for readers of the file and recomputed from the measurements on load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deepgemm.analysis.gpus import Precision
from deepgemm.analysis.roofline import Ceilings
from deepgemm.bench.suites import Shape, format_shape

FORMAT = "deepgemm-bench"
VERSION = 1
CALC_DIFF_TOLERANCE = 1e-3  # DeepGEMM's own tests accept 1e-3 for fp8 with bf16 output

Status = Literal["ok", "n/a", "error"]


class ResultsFormatError(ValueError):
    """A results file is not a deepgemm-bench document this version can read."""


@dataclass(frozen=True)
class Measurement:
    m: int
    n: int
    k: int
    impl: str
    precision: Precision
    status: Status
    reason: str | None = None  # why it is n/a or failed
    median_us: float | None = None
    min_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: int = 0
    cuda_graph: bool = True
    calc_diff: float | None = None
    bytes: int = 0
    note: str = ""
    case: str = ""  # an MoE case's label (shape: valid rows x N x K; k-grouped: M x N x tokens); "" for dense

    @property
    def shape(self) -> Shape:
        return self.m, self.n, self.k

    @property
    def where(self) -> str:
        """The shape as reports name it: M x N x K, or an MoE case's label with its valid rows (k-grouped: tokens)."""
        if not self.case:
            return format_shape(self.shape)
        return f"{self.case} ({self.k} tokens)" if self.case.startswith("k-grouped") else f"{self.case} ({self.m} rows)"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.median_us is not None and self.median_us > 0

    @property
    def tflops(self) -> float | None:
        return self.flops / (self.median_us * 1e6) if self.ok else None  # type: ignore[operator]

    @property
    def gbs(self) -> float | None:
        return self.bytes / (self.median_us * 1e3) if self.ok else None  # type: ignore[operator]

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    @property
    def accurate(self) -> bool:
        return self.calc_diff is not None and math.isfinite(self.calc_diff) and self.calc_diff <= CALC_DIFF_TOLERANCE


@dataclass
class BenchResults:
    ceilings: Ceilings
    measurements: list[Measurement]
    environment: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    implementations: dict[str, str] = field(default_factory=dict)  # name -> description
    created: str = ""

    def shapes(self) -> list[Shape]:
        return list(dict.fromkeys(m.shape for m in self.measurements))

    def impl_names(self) -> list[str]:
        return list(dict.fromkeys(m.impl for m in self.measurements))

    def find(self, shape: Shape, impl: str) -> Measurement | None:
        return next((m for m in self.measurements if m.shape == shape and m.impl == impl), None)

    def subject(self, shape: Shape) -> Measurement | None:
        """The deepgemm measurement of ``shape`` (the one speedups are quoted for), if it ran."""
        return next((m for m in self.measurements if m.shape == shape and m.impl.startswith("deepgemm")), None)

    def speedups(self, shape: Shape) -> dict[str, float]:
        """peer -> peer time / deepgemm time (> 1: deepgemm is faster), for peers that ran."""
        subject = self.subject(shape)
        if subject is None or not subject.ok:
            return {}
        return {m.impl: m.median_us / subject.median_us  # type: ignore[operator]
                for m in self.measurements if m.shape == shape and m is not subject and m.ok}

    def roofline_fraction(self, measurement: Measurement) -> float | None:
        """Achieved TFLOPS over what the roofline allows at this arithmetic intensity."""
        if measurement.tflops is None:
            return None
        return measurement.tflops / self.ceilings.attainable_tflops(measurement.intensity, measurement.precision)

    # -- JSON --------------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "created": self.created,
            "environment": self.environment,
            "settings": self.settings,
            "ceilings": {"source": self.ceilings.source, "bf16_tflops": self.ceilings.bf16_tflops,
                         "fp8_tflops": self.ceilings.fp8_tflops, "bandwidth_gbs": self.ceilings.bandwidth_gbs},
            "implementations": self.implementations,
            "results": [self._record(m) for m in self.measurements],
        }

    def _record(self, m: Measurement) -> dict[str, Any]:
        record: dict[str, Any] = {name: getattr(m, name) for name in _MEASUREMENT_FIELDS}
        record.update(flops=m.flops, tflops=m.tflops, gbs=m.gbs, roofline_fraction=self.roofline_fraction(m))
        if m.impl.startswith("deepgemm"):
            record["speedup"] = self.speedups(m.shape)
        return record

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BenchResults:
        path = Path(path)
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ResultsFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ResultsFormatError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_json(document, source=str(path))

    @classmethod
    def from_json(cls, document: Any, *, source: str = "results") -> BenchResults:
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            found = document.get("format") if isinstance(document, dict) else None
            if found is None:
                raise ResultsFormatError(f"{source}: not a {FORMAT} results file (missing \"format\": \"{FORMAT}\")")
            plan = " (a plan written without a GPU: nothing in it was measured)" if found == f"{FORMAT}-plan" else ""
            raise ResultsFormatError(f"{source}: its format is {found!r}{plan}; this reads measured runs, format "
                                     f"{FORMAT!r}")
        if document.get("version") != VERSION:
            raise ResultsFormatError(f"{source}: results format version {document.get('version')!r} is not "
                                     f"supported (this deepgemm reads version {VERSION})")
        try:
            ceilings_doc = document["ceilings"]
            ceilings = Ceilings(float(ceilings_doc["bf16_tflops"]),
                                None if ceilings_doc.get("fp8_tflops") is None else float(ceilings_doc["fp8_tflops"]),
                                float(ceilings_doc["bandwidth_gbs"]), str(ceilings_doc.get("source", "")))
            measurements = [_measurement(record) for record in document["results"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsFormatError(f"{source}: malformed results ({type(exc).__name__}: {exc})") from None
        return cls(ceilings, measurements, dict(document.get("environment") or {}),
                   dict(document.get("settings") or {}), dict(document.get("implementations") or {}),
                   str(document.get("created", "")))


_MEASUREMENT_FIELDS = ("m", "n", "k", "impl", "precision", "status", "reason", "median_us", "min_us", "p10_us",
                       "p90_us", "samples", "cuda_graph", "calc_diff", "bytes", "note", "case")
_STATUSES = ("ok", "n/a", "error")


def _measurement(record: dict[str, Any]) -> Measurement:
    values = {name: record[name] for name in _MEASUREMENT_FIELDS if name in record}
    for name in ("m", "n", "k"):
        if not isinstance(values.get(name), int) or values[name] <= 0:
            raise ValueError(f"result field {name!r} must be a positive integer, got {values.get(name)!r}")
    if values.get("status") not in _STATUSES:
        raise ValueError(f"result status must be one of {_STATUSES}, got {values.get('status')!r}")
    if values.get("precision") not in ("fp8", "bf16"):
        raise ValueError(f"result precision must be fp8 or bf16, got {values.get('precision')!r}")
    if not isinstance(values.get("impl"), str):
        raise ValueError("result field 'impl' must be a string")
    return Measurement(**values)
