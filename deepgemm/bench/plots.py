"""Charts of benchmark results (matplotlib, Agg canvas: no display needed).

- roofline: log-log throughput against arithmetic intensity, with the GPU's memory and compute roofs
  and one point per shape and implementation;
- speedups: deepgemm's speedup over each peer, one group of bars per shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepgemm.bench.results import BenchResults
from deepgemm.bench.suites import format_shape

_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def roofline_figure(results: BenchResults) -> Any:
    figure = _new_figure(9, 6)
    axes = figure.add_subplot()
    points = [m for m in results.measurements if m.ok]
    intensities = [m.intensity for m in points] or [1.0, 1000.0]
    low, high = min(intensities) / 2, max(intensities) * 2
    ceilings = results.ceilings
    for precision, style in (("fp8", "-"), ("bf16", "--")):
        if precision == "fp8" and ceilings.fp8_tflops is None:
            continue
        peak = ceilings.tflops(precision)  # type: ignore[arg-type]
        ridge = ceilings.ridge_intensity(precision)  # type: ignore[arg-type]
        xs = [low, min(max(ridge, low), high), high]
        axes.plot(xs, [ceilings.attainable_tflops(x, precision) for x in xs],  # type: ignore[arg-type]
                  style, color="0.35", linewidth=1.2, label=f"{precision} roof: {peak:,.0f} TFLOPS")
    axes.plot([], [], " ", label=f"memory roof: {ceilings.bandwidth_gbs:,.0f} GB/s")
    for index, impl in enumerate(results.impl_names()):
        mine = [m for m in points if m.impl == impl]
        if mine:
            axes.scatter([m.intensity for m in mine], [m.tflops for m in mine], marker=_MARKERS[index % len(_MARKERS)],
                         s=36, label=impl, zorder=3)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    axes.set_ylabel("throughput (TFLOPS)")
    kind = "measured" if ceilings.source.startswith("measured") else "datasheet"
    axes.set_title(f"Roofline on {results.environment.get('device', 'a GPU')} ({kind} ceilings)")
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(fontsize="small", loc="lower right")
    return figure


def speedup_figure(results: BenchResults) -> Any | None:
    """None when no shape has a deepgemm measurement and a peer to compare with."""
    shapes = [shape for shape in results.shapes() if results.speedups(shape)]
    if not shapes:
        return None
    peers = list(dict.fromkeys(peer for shape in shapes for peer in results.speedups(shape)))
    figure = _new_figure(min(16.0, max(8.0, 0.25 * len(shapes) * len(peers) + 3)), 5.5)
    axes = figure.add_subplot()
    width = 0.8 / len(peers)
    for index, peer in enumerate(peers):
        xs = [i + (index - (len(peers) - 1) / 2) * width for i in range(len(shapes))]
        values = [results.speedups(shape).get(peer, 0.0) for shape in shapes]
        axes.bar(xs, values, width=width, label=f"vs {peer}")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(shapes)), [format_shape(shape) for shape in shapes], rotation=60, ha="right",
                    fontsize="small")
    axes.set_xlabel("shape (MxNxK)")
    axes.set_ylabel("deepgemm speedup (peer time / deepgemm time)")
    axes.set_title("deepgemm speedup per shape (> 1: deepgemm faster)")
    axes.legend(fontsize="small")
    axes.grid(True, axis="y", alpha=0.25)
    return figure


def save(figure: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=130)
    return path
