"""`deepgemm bench --flush {zero,read}`: how L2 is flushed before each sample reaches the timer, the results file,
its Markdown summary and `--compare` (a zeroing flush leaves dirty lines whose write-back decode-size GEMMs pay)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from deepgemm.bench import runner
from deepgemm.bench.block_runner import BlockSettings
from deepgemm.bench.compare import compare
from deepgemm.bench.report import markdown_summary
from deepgemm.bench.results import BenchResults
from deepgemm.cli import main
from deepgemm.tuning import timing
from deepgemm.tuning.timing import Timing
from tests.cpu.test_bench_compare import document, record
from tests.cpu.test_bench_runner import FakeProblem, _impl


@pytest.mark.parametrize("mode", ["zero", "read"])
def test_the_mode_reaches_the_timer_and_the_results(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    seen: list[dict[str, Any]] = []

    def fake_interleaved(fns: list, **kwargs: Any) -> list[Timing]:
        seen.append(kwargs)
        return [Timing.from_samples([10.0, 11.0, 12.0]) for _ in fns]

    monkeypatch.setattr(runner, "bench_gpu_interleaved", fake_interleaved)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    settings = runner.BenchSettings(iters=3, warmup=0, flush_mode=mode)  # type: ignore[arg-type]
    runner.measure_all([_impl("deepgemm", "fp8-blockwise")], FakeProblem(), settings)  # type: ignore[arg-type]
    assert seen and all(kwargs["flush_mode"] == mode and kwargs["flush_l2"] for kwargs in seen)
    assert settings.to_json()["flush_mode"] == mode
    assert BlockSettings(flush_mode=mode).to_json()["flush_mode"] == mode  # type: ignore[arg-type]


def test_an_unknown_mode_is_refused_before_any_gpu_work() -> None:
    with pytest.raises(ValueError, match="flush mode must be one of zero, read, got 'write'"):
        timing.l2_flush("write")  # type: ignore[arg-type]
    calls: list[int] = []
    for bench in (timing.bench_gpu, lambda fn, **kw: timing.bench_gpu_interleaved([fn], **kw)):
        with pytest.raises(ValueError, match="flush mode must be one of zero, read, got 'write'"):
            bench(lambda: calls.append(1), flush_mode="write")  # type: ignore[operator]
    assert calls == [], "the function under test was called (warm-ups) before the mode was checked"


def test_the_cli_refuses_an_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--flush", "write"])
    assert exit_info.value.code == 2
    assert "--flush: invalid choice: 'write'" in capsys.readouterr().err


def _results(settings: dict[str, Any]) -> BenchResults:
    doc = document([{**record((64, 2112, 7168), "deepgemm", 10.0), "p10_us": 9.5, "p90_us": 10.5}])
    doc["settings"] = {"dtype": "fp8", "iters": 30, "warmup": 5, "use_graph": True, **settings}
    return BenchResults.from_json(doc)


@pytest.mark.parametrize("settings,phrase", [
    ({"flush_l2_bytes": 256 << 20, "flush_mode": "zero"}, "L2 flushed with 256 MiB before each"),
    ({"flush_l2_bytes": 256 << 20}, "L2 flushed with 256 MiB before each"),  # files written before the mode
    ({"flush_l2_bytes": 256 << 20, "flush_mode": "read"}, "L2 flushed by reading 256 MiB before each"),
    ({"flush_l2_bytes": 0, "flush_mode": "zero"}, "L2 not flushed before each"),
])
def test_the_summary_says_how_l2_was_flushed(settings: dict[str, Any], phrase: str) -> None:
    assert phrase in markdown_summary(_results(settings))


def test_compare_notes_a_different_mode() -> None:
    zero, read = (_results({"flush_l2_bytes": 256 << 20, "flush_mode": mode}) for mode in ("zero", "read"))
    assert any("--flush zero, this run with --flush read" in note for note in compare(zero, read).notes)
    assert not compare(zero, _results({"flush_l2_bytes": 256 << 20})).notes  # no mode recorded: zeroing


def test_zero_writes_the_buffer_and_read_only_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = torch.arange(1, 1025, dtype=torch.int32)  # (a CPU stand-in for the 256 MiB device buffer)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "_flush_buffer", lambda device: buffer)
    timing.l2_flush("read")()
    assert torch.equal(buffer, torch.arange(1, 1025, dtype=torch.int32))
    timing.l2_flush("zero")()
    assert not buffer.any()


class _Event:
    """A CPU stand-in for torch.cuda.Event that logs its records into the shared call log."""

    def __init__(self, log: list[str], enable_timing: bool = True) -> None:
        self.log = log

    def record(self) -> None:
        self.log.append("record")

    def elapsed_time(self, other: "_Event") -> float:
        return 0.005


@pytest.mark.parametrize("flush_l2", [True, False])
def test_every_sample_has_gpu_work_queued_ahead_of_its_start_event(monkeypatch: pytest.MonkeyPatch,
                                                                   flush_l2: bool) -> None:
    """Unflushed, a memory-free spin precedes each start event (else a short kernel's sample is the host's launch
    gap); flushed, the flush does and no spin runs. The order per sample: hold, start, the call, end."""
    log: list[str] = []
    buffer = torch.zeros(16, dtype=torch.int32)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "_flush_buffer", lambda device: buffer)
    monkeypatch.setattr(buffer, "zero_", lambda: log.append("flush"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"spin {cycles}"))
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: _Event(log, enable_timing))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    result = timing.bench_gpu(lambda: log.append("call"), iters=3, warmup=0, flush_l2=flush_l2, use_graph=False)
    assert result.median_us == pytest.approx(5.0) and not result.graph
    hold = "flush" if flush_l2 else f"spin {timing.HOLD_CYCLES}"
    assert log == ["call"] + [hold, "record", "call", "record"] * 3  # (the first call: the eager launch before timing)
    assert timing.HOLD_CYCLES >= 100_000  # ~50 us at 2 GHz: more than a slow host takes to queue a graph replay
