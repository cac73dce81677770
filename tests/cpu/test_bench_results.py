"""Results file format, report rendering, regression verdicts and charts, on crafted results."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from deepgemm.analysis.roofline import Ceilings
from deepgemm.bench.compare import compare
from deepgemm.bench.report import geomean_speedups, markdown_summary, problems, result_rows
from deepgemm.bench.results import BenchResults, Measurement, ResultsFormatError

CEILINGS = Ceilings(bf16_tflops=800.0, fp8_tflops=1450.0, bandwidth_gbs=4300.0, source="measured on test GPU")
SHAPES = [(64, 2112, 7168), (128, 24576, 1536), (4096, 7168, 2048)]
TIMES_US = {"deepgemm": [10.0, 20.0, 100.0], "cublas-blockwise": [12.0, 30.0, 110.0],
            "cublas-fp8-tensor": [9.0, 18.0, 90.0], "cublas-bf16": [15.0, 40.0, 190.0]}


def ok(shape: tuple[int, int, int], impl: str, us: float, *, calc_diff: float = 1e-5) -> Measurement:
    m, n, k = shape
    precision = "bf16" if impl.endswith("bf16") else "fp8"
    size = 2 if precision == "bf16" else 1
    return Measurement(m, n, k, impl, precision, "ok", median_us=us, min_us=0.95 * us, p10_us=0.97 * us,
                       p90_us=1.05 * us, samples=30, calc_diff=calc_diff, bytes=size * (m * k + n * k) + 2 * m * n)


def crafted(scale: float = 1.0, **overrides: float) -> BenchResults:
    """Results with deepgemm times multiplied by ``scale`` (and per-shape overrides 'M_N_K': factor)."""
    rows = []
    for index, shape in enumerate(SHAPES):
        for impl, times in TIMES_US.items():
            factor = scale * overrides.get("_".join(map(str, shape)), 1.0) if impl == "deepgemm" else 1.0
            rows.append(ok(shape, impl, times[index] * factor))
    return BenchResults(CEILINGS, rows, {"device": "NVIDIA H200"}, {"dtype": "fp8", "iters": 30, "warmup": 5,
                                                                    "flush_l2_bytes": 256 << 20, "use_graph": True},
                        {impl: impl for impl in TIMES_US}, "2026-01-01T00:00:00+00:00")


def test_round_trip_and_derived_fields(tmp_path: Path) -> None:
    results = crafted()
    path = tmp_path / "r.json"
    results.save(path)
    document = json.loads(path.read_text())
    assert (document["format"], document["version"]) == ("deepgemm-bench", 1)
    first = document["results"][0]
    assert first["flops"] == 2 * 64 * 2112 * 7168
    assert first["tflops"] == pytest.approx(2 * 64 * 2112 * 7168 / 10e-6 / 1e12)
    assert first["speedup"]["cublas-blockwise"] == pytest.approx(1.2)
    loaded = BenchResults.load(path)
    assert loaded.measurements == results.measurements and loaded.ceilings == results.ceilings


def test_speedups_and_geomean() -> None:
    results = crafted()
    assert results.speedups(SHAPES[2]) == pytest.approx(
        {"cublas-blockwise": 1.1, "cublas-fp8-tensor": 0.9, "cublas-bf16": 1.9})
    geomean, count = geomean_speedups(results)["cublas-blockwise"]
    assert count == 3 and geomean == pytest.approx((1.2 * 1.5 * 1.1) ** (1 / 3))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"version": 1}, "not a deepgemm-bench results file"),
        ({"format": "something-else"}, "its format is 'something-else'; this reads measured runs"),
        ({"format": "deepgemm-bench-plan", "version": 1}, "a plan written without a GPU: nothing in it was measured"),
        ({"format": "deepgemm-bench", "version": 99}, "version 99 is not supported"),
        ({"format": "deepgemm-bench", "version": 1, "ceilings": {}}, "malformed results"),
        ({"format": "deepgemm-bench", "version": 1,
          "ceilings": {"bf16_tflops": 1, "fp8_tflops": 2, "bandwidth_gbs": 3},
          "results": [{"m": 0, "n": 1, "k": 1, "impl": "x", "precision": "fp8", "status": "ok"}]}, "'m'"),
    ],
)
def test_bad_results_files_are_rejected(tmp_path: Path, document: object, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultsFormatError, match=message):
        BenchResults.load(path)
    path.write_text("{oops")
    with pytest.raises(ResultsFormatError, match="not valid JSON"):
        BenchResults.load(path)


def test_report_rows_markdown_and_problems() -> None:
    results = crafted()
    results.measurements.append(Measurement(1, 2112, 7168, "cublas-blockwise", "fp8", "n/a",
                                            reason="cuBLAS block-wise FP8 refuses M = 1"))
    results.measurements.append(dataclasses.replace(ok((1, 2112, 7168), "deepgemm", 5.0), calc_diff=0.5))
    rows = result_rows(results)
    assert len(rows) == 14
    assert rows[0][:2] == ["64x2112x7168", "deepgemm"] and rows[1][-1] == "1.20x"
    assert any(row[2] == "n/a" and "M = 1" in row[3] for row in rows)
    assert any(row[8].endswith("FAIL") for row in rows)
    text = markdown_summary(results, plots=["roofline.png"])
    assert "| cublas-blockwise | 1.26x | 3 |" in text
    assert "![roofline.png](roofline.png)" in text and "refuses M = 1" in text
    assert len(problems(results)) == 2


@pytest.mark.parametrize(
    ("current", "verdict", "failed"),
    [
        (crafted(1.0), "ok", False),
        (crafted(1.03), "ok", False),  # 3 % slower: inside the 5 % noise band
        (crafted(0.8), "improved", False),
        (crafted(1.0, **{"4096_7168_2048": 1.2}), "regressed", True),  # one shape 20 % slower
    ],
)
def test_regression_verdicts(current: BenchResults, verdict: str, failed: bool) -> None:
    comparison = compare(crafted(), current, fail_below=0.95)
    assert comparison.failed is failed and comparison.exit_code == int(failed)
    assert verdict in {row.verdict for row in comparison.rows}
    assert comparison.verdict_line().startswith("FAIL" if failed else "PASS")
    assert [row.impl for row in comparison.rows] == ["deepgemm"] * 3  # peers do not gate by default


def test_broken_inaccurate_missing_and_gate_choice() -> None:
    baseline = crafted()
    current = crafted()
    current.measurements = [m for m in current.measurements if m.shape != SHAPES[0]]
    current.measurements[0] = dataclasses.replace(current.measurements[0], status="error", median_us=None,
                                                  reason="boom")
    current.measurements[4] = dataclasses.replace(current.measurements[4], calc_diff=0.2)
    verdicts = {row.shape: row.verdict for row in compare(baseline, current).rows}
    assert verdicts == {SHAPES[0]: "missing", SHAPES[1]: "broken", SHAPES[2]: "inaccurate"}
    gated = compare(baseline, crafted(), gate=["cublas-bf16", "deepgemm"])
    assert {row.impl for row in gated.rows} == {"cublas-bf16", "deepgemm"}
    with pytest.raises(ValueError, match="--gate"):
        compare(baseline, current, gate=["nope"])
    peers_only = BenchResults(CEILINGS, [m for m in baseline.measurements if m.impl != "deepgemm"])
    with pytest.raises(ValueError, match="no deepgemm measurements"):
        compare(peers_only, current)
    other_gpu = crafted()
    other_gpu.environment["device"] = "NVIDIA H100"
    assert "different GPUs" in compare(baseline, other_gpu).notes[0]


def test_charts_are_written_with_labelled_axes(tmp_path: Path) -> None:
    from deepgemm.bench.plots import roofline_figure, save, speedup_figure

    results = crafted()
    roofline = roofline_figure(results)
    axes = roofline.axes[0]
    assert axes.get_xscale() == axes.get_yscale() == "log"
    assert "intensity" in axes.get_xlabel() and "TFLOPS" in axes.get_ylabel()
    assert len(axes.collections) == 4  # one scatter per implementation
    speedup = speedup_figure(results)
    assert speedup is not None and "speedup" in speedup.axes[0].get_ylabel()
    assert speedup.axes[0].get_xlabel() == "shape (MxNxK)"
    for name, figure in (("roofline.png", roofline), ("speedup.png", speedup)):
        path = save(figure, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    peers_only = BenchResults(CEILINGS, [m for m in results.measurements if m.impl != "deepgemm"])
    assert speedup_figure(peers_only) is None
