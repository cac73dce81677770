"""Render benchmark results: one row per shape and implementation, as a terminal table or Markdown."""

from __future__ import annotations

import math
from collections.abc import Sequence

from deepgemm.analysis.roofline import Ceilings
from deepgemm.bench.console import print_table
from deepgemm.bench.results import CALC_DIFF_TOLERANCE, BenchResults, Measurement

HEADERS = ("shape (MxNxK) or case", "implementation", "median us", "p10-p90 us", "TFLOPS", "% peak", "GB/s", "% BW",
           "calc_diff", "speedup")
SPEEDUP_NOTE = "speedup: deepgemm's over the row's implementation (its time / deepgemm's)"
# Left out of the terminal table, in this order, while it does not fit (the JSON and Markdown keep them).
TABLE_DROP = (HEADERS.index("p10-p90 us"), HEADERS.index("GB/s"), HEADERS.index("% peak"))


def print_results_table(title: str, results: BenchResults) -> None:
    """The results as a terminal table: shape and implementation first, fitted to the terminal (or 100 columns)."""
    print_table(title, HEADERS, result_rows(results), left_columns=2, key_columns=2, drop=TABLE_DROP,
                caption=SPEEDUP_NOTE)


def result_rows(results: BenchResults) -> list[list[str]]:
    rows = []
    for shape in results.shapes():
        speedups = results.speedups(shape)
        for impl in results.impl_names():
            m = results.find(shape, impl)
            if m is not None:
                rows.append(_row(results, m, speedups.get(impl)))
    return rows


def _row(results: BenchResults, m: Measurement, speedup: float | None) -> list[str]:
    shape = m.where
    if not m.ok:
        return [shape, m.impl, m.status, m.reason or "", "", "", "", "", "", ""]
    ceilings = results.ceilings
    peak = ceilings.tflops(m.precision) if m.precision == "bf16" or ceilings.fp8_tflops else None
    tflops, gbs = m.tflops or 0.0, m.gbs or 0.0  # set: the measurement is ok
    diff = f"{m.calc_diff:.1e}" if m.calc_diff is not None else "-"
    if not m.accurate:
        diff += " FAIL"
    return [
        shape, m.impl, f"{m.median_us:.1f}", f"{m.p10_us:.1f}-{m.p90_us:.1f}", f"{tflops:.0f}",
        f"{100 * tflops / peak:.0f}%" if peak else "-", f"{gbs:.0f}",
        f"{100 * gbs / ceilings.bandwidth_gbs:.0f}%", diff,
        f"{speedup:.2f}x" if speedup is not None else "",
    ]


def geomean_speedups(results: BenchResults) -> dict[str, tuple[float, int]]:
    """peer -> (geometric-mean speedup of deepgemm over it, number of shapes both ran)."""
    logs: dict[str, list[float]] = {}
    for shape in results.shapes():
        for peer, speedup in results.speedups(shape).items():
            logs.setdefault(peer, []).append(math.log(speedup))
    return {peer: (math.exp(sum(values) / len(values)), len(values)) for peer, values in logs.items()}


def summary_line(results: BenchResults) -> str:
    """One line: the shapes and GPU, deepgemm's geometric-mean speedup over each peer, and its failures."""
    speedups = ", ".join(f"{value:.2f}x vs {peer}" for peer, (value, _) in geomean_speedups(results).items())
    failed = sum(1 for m in results.measurements
                 if m.impl.startswith("deepgemm") and (m.status == "error" or (m.ok and not m.accurate)))
    device = results.environment.get("device", "this GPU")
    return (f"summary: {len(results.shapes())} shapes on {device}: deepgemm "
            f"{speedups + ' (geometric means)' if speedups else 'with no peer to compare'}; "
            f"{failed} deepgemm {'row' if failed == 1 else 'rows'} failed or inaccurate")


def ceilings_line(c: Ceilings) -> str:
    fp8 = f"fp8 {c.fp8_tflops:,.0f} TFLOPS, " if c.fp8_tflops else ""
    return f"ceilings ({c.source}): {fp8}bf16 {c.bf16_tflops:,.0f} TFLOPS, copy {c.bandwidth_gbs:,.0f} GB/s"


def problems(results: BenchResults) -> list[str]:
    """Lines naming every failed, unavailable or inaccurate measurement."""
    lines = []
    for m in results.measurements:
        where = f"{m.where} {m.impl}"
        if m.status != "ok":
            lines.append(f"{where}: {m.status}: {m.reason}")
        elif not m.accurate:
            lines.append(f"{where}: calc_diff {m.calc_diff} above tolerance {CALC_DIFF_TOLERANCE}")
    return lines


def _flush_phrase(settings: dict) -> str:
    """How the run flushed L2 (settings of a results file; files before flush_mode zeroed)."""
    mib = settings.get("flush_l2_bytes", 0) >> 20
    if not mib:
        return "L2 not flushed"
    return f"L2 flushed by reading {mib} MiB" if settings.get("flush_mode") == "read" else f"L2 flushed with {mib} MiB"


def markdown_summary(results: BenchResults, *, plots: Sequence[str] = ()) -> str:
    env = results.environment
    lines = ["# deepgemm benchmark", ""]
    device = env.get("device", "unknown GPU")
    lines.append(f"- GPU: {device} ({env.get('num_sms', '?')} SMs), torch {env.get('torch', '?')}, "
                 f"CUDA {env.get('cuda', '?')}, deepgemm {env.get('deepgemm', '?')}")
    settings = results.settings
    if settings:
        layout = f" (layout {settings['layout']})" if settings.get("dtype") == "bf16" and "layout" in settings else ""
        lines.append(f"- dtype {settings.get('dtype', '?')}{layout}, "
                     f"{settings.get('iters', '?')} samples after {settings.get('warmup', '?')} warm-up calls, "
                     f"{_flush_phrase(settings)} before each, "
                     f"CUDA graph replay: {settings.get('use_graph', '?')}")
    lines.append(f"- {ceilings_line(results.ceilings)}")
    if results.created:
        lines.append(f"- run at {results.created}")
    lines.append("")
    speedups = geomean_speedups(results)
    if speedups:
        lines += ["## deepgemm speedup (geometric mean)", "", "| peer | speedup | shapes |", "|---|---:|---:|"]
        lines += [f"| {peer} | {value:.2f}x | {count} |" for peer, (value, count) in speedups.items()]
        lines.append("")
    lines += ["## Results", "", SPEEDUP_NOTE, "", "| " + " | ".join(HEADERS) + " |",
              "|" + "|".join("---" if i < 2 else "---:" for i in range(len(HEADERS))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in result_rows(results)]
    issues = problems(results)
    if issues:
        lines += ["", "## Not measured or inaccurate", ""] + [f"- {issue}" for issue in issues]
    if plots:
        lines += [""] + [f"![{path}]({path})" for path in plots]
    return "\n".join(lines) + "\n"
