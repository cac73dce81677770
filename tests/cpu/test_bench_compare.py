"""`bench --compare --relative-to PEER`: the regression gate on same-run speed ratios to a peer, which a host
uniformly faster or slower than the baseline's does not move."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from deepgemm.bench.compare import compare
from deepgemm.bench.results import BenchResults, Measurement
from deepgemm.cli import main

PEER = "deepseek-deepgemm"
SHAPES = [(64, 2112, 7168), (4096, 7168, 2048)]
BASE_US = {"deepgemm": [10.0, 100.0], PEER: [11.0, 105.0], "cublas-blockwise": [12.0, 110.0]}


def record(shape: tuple[int, int, int], impl: str, us: float | None, *, status: str = "ok",
           calc_diff: float = 1e-5, reason: str | None = None) -> dict[str, Any]:
    m, n, k = shape
    return {"m": m, "n": n, "k": k, "impl": impl, "precision": "fp8", "status": status, "reason": reason,
            "median_us": us, "samples": 30 if us else 0, "calc_diff": calc_diff if us else None,
            "bytes": m * k + n * k + 2 * m * n}


def document(records: list[dict[str, Any]], device: str = "NVIDIA H200") -> dict[str, Any]:
    return {"format": "deepgemm-bench", "version": 1, "environment": {"device": device},
            "settings": {"dtype": "fp8"}, "implementations": {},
            "ceilings": {"bf16_tflops": 800.0, "fp8_tflops": 1450.0, "bandwidth_gbs": 4300.0},
            "results": records}


def results(scale: dict[str, float] | None = None, *, times: dict[str, list[float]] | None = None,
            drop: tuple[tuple[tuple[int, int, int], str], ...] = (), device: str = "NVIDIA H200") -> BenchResults:
    """BASE_US (or ``times``) with each implementation's times multiplied by ``scale[impl]``, read through
    from_json as a results file would be; ``drop`` leaves (shape, impl) out."""
    records = [record(shape, impl, us * (scale or {}).get(impl, 1.0))
               for impl, row in (times or BASE_US).items() for shape, us in zip(SHAPES, row)
               if (shape, impl) not in drop]
    return BenchResults.from_json(document(records, device))


def test_relative_ratio_on_a_hand_made_example() -> None:
    baseline = BenchResults.from_json(document([record(SHAPES[0], "deepgemm", 100.0), record(SHAPES[0], PEER, 90.0)]))
    current = BenchResults.from_json(document([record(SHAPES[0], "deepgemm", 50.0), record(SHAPES[0], PEER, 50.0)]))
    (row,) = compare(baseline, current, relative_to=PEER).rows
    assert row.relative_baseline == pytest.approx(0.9) and row.relative_current == pytest.approx(1.0)
    assert row.ratio == pytest.approx(1 / 0.9) and row.verdict == "improved"
    assert (row.baseline_us, row.current_us) == (100.0, 50.0)  # the implementation's own times, for reading
    (absolute,) = compare(baseline, current).rows
    assert absolute.ratio == pytest.approx(2.0) and absolute.relative_baseline is None


def test_a_uniformly_slower_host_passes_relative_but_fails_absolute() -> None:
    slower = results({impl: 1.15 for impl in BASE_US}, device="NVIDIA H200 (other host)")
    absolute = compare(results(), slower)
    assert absolute.failed and {row.verdict for row in absolute.rows} == {"regressed"}
    relative = compare(results(), slower, relative_to=PEER)
    assert not relative.failed and relative.exit_code == 0
    assert [row.ratio for row in relative.rows] == pytest.approx([1.0, 1.0])
    assert {row.verdict for row in relative.rows} == {"ok"}
    line = relative.verdict_line()
    assert line.startswith("PASS: 2 shapes at or above 0.95x of the baseline's speed relative to deepseek-deepgemm")
    assert "geomean 1.000x" in line
    assert "same-run ratios to deepseek-deepgemm" in relative.notes[0]


def test_a_same_run_regression_fails_the_relative_gate() -> None:
    current = results({"deepgemm": 1.2})  # ours 20 % slower, the peer as fast as before
    comparison = compare(results(), current, relative_to=PEER)
    assert comparison.failed and comparison.exit_code == 1
    assert [row.ratio for row in comparison.rows] == pytest.approx([1 / 1.2] * 2)
    assert {row.verdict for row in comparison.rows} == {"regressed"}
    assert comparison.verdict_line().startswith(
        "FAIL: 2 of 2 checks failed (threshold 0.95x of the baseline's speed relative to deepseek-deepgemm)")
    # a peer that got faster is a loss for us too, though our absolute time did not move
    assert compare(results(), results({PEER: 0.8}), relative_to=PEER).failed
    assert not compare(results(), results({PEER: 0.8})).failed


def test_missing_or_failed_peer_is_na_with_the_file_that_lacks_it() -> None:
    baseline = results(drop=((SHAPES[0], PEER),))
    current = results()
    current.measurements = [Measurement(*SHAPES[1], PEER, "fp8", "error", reason="boom")
                            if (m.shape, m.impl) == (SHAPES[1], PEER) else m for m in current.measurements]
    rows = compare(baseline, current, relative_to=PEER).rows
    assert [row.verdict for row in rows] == ["n/a", "n/a"]
    assert rows[0].detail == "no deepseek-deepgemm time in the baseline (not measured)"
    assert rows[1].detail == "no deepseek-deepgemm time in this run (error: boom)"
    assert rows[0].ratio is None and rows[0].relative_baseline is None and rows[0].relative_current is not None
    both = compare(baseline, results(drop=((SHAPES[0], PEER),)), relative_to=PEER).rows[0]
    assert both.detail == "no deepseek-deepgemm time in the baseline (not measured) nor this run (not measured)"
    comparison = compare(results(drop=tuple((shape, PEER) for shape in SHAPES[1:])), current, relative_to=PEER)
    assert not comparison.failed and comparison.verdict_line().startswith("PASS: 1 shapes")


def test_other_verdicts_keep_their_meaning() -> None:
    baseline = results(drop=((SHAPES[1], "deepgemm"),))
    current = results()
    current.measurements = [Measurement(*SHAPES[0], "deepgemm", "fp8", "error", reason="launch failed")
                            if (m.shape, m.impl) == (SHAPES[0], "deepgemm") else m for m in current.measurements]
    assert [row.verdict for row in compare(baseline, current, relative_to=PEER).rows] == ["broken", "fixed"]
    assert [row.verdict for row in compare(results(), results(drop=((SHAPES[0], "deepgemm"),)),
                                           relative_to=PEER).rows] == ["missing", "ok"]
    wrong = results()
    assert (wrong.measurements[0].shape, wrong.measurements[0].impl) == (SHAPES[0], "deepgemm")
    wrong.measurements[0] = dataclasses.replace(wrong.measurements[0], calc_diff=0.5)
    rows = compare(results(), wrong, relative_to=PEER).rows
    assert rows[0].verdict == "inaccurate" and rows[0].ratio == pytest.approx(1.0)
    no_peer = results(drop=((SHAPES[0], PEER),))
    no_peer.measurements[0] = wrong.measurements[0]
    assert compare(results(), no_peer, relative_to=PEER).rows[0].verdict == "inaccurate"  # fails without a ratio


def test_unknown_peer_raises_naming_relative_to() -> None:
    with pytest.raises(ValueError, match=r"argument --relative-to: cublas-nope not in the baseline \(it has: "
                                         r"deepgemm, deepseek-deepgemm, cublas-blockwise\)"):
        compare(results(), results(), relative_to="cublas-nope")


def test_the_peer_is_not_gated_against_itself() -> None:
    rows = compare(results(), results(), gate=["deepgemm", PEER, "cublas-blockwise"], relative_to=PEER).rows
    assert [row.impl for row in rows] == ["deepgemm", "cublas-blockwise"] * 2
    with pytest.raises(ValueError, match="--relative-to: --gate names only deepseek-deepgemm"):
        compare(results(), results(), gate=[PEER], relative_to=PEER)
    only = {"deepgemm": BASE_US["deepgemm"], "cublas-blockwise": BASE_US["cublas-blockwise"]}
    with pytest.raises(ValueError, match="--relative-to: deepgemm is the baseline's only deepgemm"):
        compare(results(times=only), results(times=only), relative_to="deepgemm")
    gated = compare(results(times=only), results(times=only), relative_to="deepgemm", gate=["cublas-blockwise"])
    assert [row.impl for row in gated.rows] == ["cublas-blockwise"] * 2


def write(path: Path, results_: BenchResults) -> str:
    path.write_text(json.dumps(results_.to_json()))
    return str(path)


def test_cli_relative_to_exits_0_or_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.json", results())
    slower = write(tmp_path / "slower.json", results({impl: 1.15 for impl in BASE_US}))
    regressed = write(tmp_path / "regressed.json", results({"deepgemm": 1.2}))

    assert main(["bench", "--compare", base, "--results", slower]) == 1
    assert "FAIL: 2 of 2" in capsys.readouterr().out
    assert main(["bench", "--compare", base, "--results", slower, "--relative-to", PEER]) == 0
    out = capsys.readouterr().out
    assert "PASS: 2 shapes at or above 0.95x of the baseline's speed relative to deepseek-deepgemm" in out
    assert "rel. baseline" in out and "rel. now" in out and "1.100x" in out  # 11 us / 10 us in both files
    assert max(len(line) for line in out.splitlines() if "│" in line) <= 100

    assert main(["bench", "--compare", base, "--results", regressed, "--relative-to", PEER]) == 1
    out = capsys.readouterr().out
    assert "FAIL: 2 of 2 checks failed (threshold 0.95x of the baseline's speed relative to deepseek-deepgemm)" in out


def test_cli_bad_relative_to_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.json", results())
    assert main(["bench", "--compare", base, "--results", base, "--relative-to", "nope"]) == 2
    assert "argument --relative-to: nope not in the baseline" in capsys.readouterr().err
    assert main(["bench", "--results", base, "--relative-to", PEER]) == 2
    assert main(["bench", "--suite", "smoke", "--relative-to", PEER]) == 2
    assert "argument --relative-to: needs --compare" in capsys.readouterr().err
    assert main(["bench", "--model", "llama-3-8b", "--relative-to", PEER]) == 2
    assert "argument --model: not with --relative-to" in capsys.readouterr().err
