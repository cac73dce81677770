"""The benchmark on a real Hopper GPU: every implementation runs (or says why not) and is accurate."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from deepgemm.analysis.gpus import get_gpu
from deepgemm.analysis.roofline import Ceilings
from deepgemm.bench.results import BenchResults
from deepgemm.bench.runner import BenchSettings, run_bench
from deepgemm.bench.suites import Shape, suite_shapes

pytestmark = pytest.mark.gpu


def quiet(items: Sequence[Shape], description: str, label: Callable[[Shape], str]) -> Iterator[Shape]:
    return iter(items)


def datasheet() -> Ceilings:
    return Ceilings.from_spec(get_gpu("h200"))


def test_smoke_suite_every_implementation_within_tolerance(tmp_path: Path) -> None:
    results = run_bench(suite_shapes("smoke"), BenchSettings(suite="smoke"), datasheet(), progress=quiet)
    assert len(results.shapes()) == 3
    for m in results.measurements:
        assert m.status in ("ok", "n/a"), f"{m.shape} {m.impl}: {m.reason}"
        if m.ok:
            assert m.accurate, f"{m.shape} {m.impl}: calc_diff {m.calc_diff}"
            assert m.samples == 30 and m.min_us <= m.median_us <= m.p90_us  # type: ignore[operator]
            assert m.cuda_graph, f"{m.shape} {m.impl} fell back to eager launches"
    for shape in results.shapes():
        subject = results.subject(shape)
        assert subject is not None and subject.ok, f"deepgemm did not run {shape}: {subject and subject.reason}"
        assert {"cublas-blockwise", "cublas-fp8-tensor", "cublas-bf16"} <= set(results.speedups(shape))
    path = tmp_path / "smoke.json"
    results.save(path)
    assert BenchResults.load(path).measurements == results.measurements


def test_cublas_blockwise_refuses_m1_as_not_applicable() -> None:
    results = run_bench([(1, 2112, 7168)], BenchSettings(iters=5, warmup=1), datasheet(), progress=quiet)
    blockwise = results.find((1, 2112, 7168), "cublas-blockwise")
    assert blockwise is not None and blockwise.status == "n/a" and "M = 1" in (blockwise.reason or "")
    deepgemm = results.subject((1, 2112, 7168))
    assert deepgemm is not None and deepgemm.ok and deepgemm.accurate


def test_bench_gpu_samples_and_spread() -> None:
    import torch

    from deepgemm.tuning.timing import bench_gpu

    x = torch.randn(4096, 4096, device="cuda")
    timing = bench_gpu(lambda: x.mul_(1.0), iters=30, warmup=2)
    assert len(timing.samples_us) == 30 and timing.graph
    assert 0 < timing.min_us <= timing.p10_us <= timing.median_us <= timing.p90_us


def test_interleaved_timing_takes_one_sample_of_each_per_round() -> None:
    """Rounds of one sample per function, each round starting with the next function; every function keeps
    its own samples. Eager launches (no graph) so the Python calls show the order."""
    import torch

    from deepgemm.tuning.timing import bench_gpu_interleaved

    sources = [torch.randn(1 << 20, device="cuda") for _ in range(3)]
    outs = [torch.empty_like(x) for x in sources]
    order: list[int] = []

    def copier(i: int):  # noqa: ANN202
        def copy() -> None:
            order.append(i)
            outs[i].copy_(sources[i])
        return copy

    timings = bench_gpu_interleaved([copier(i) for i in range(3)], iters=4, warmup=1, use_graph=False)
    assert order[:6] == [0, 0, 1, 1, 2, 2]  # per function: its warmup, then the first launch
    assert order[6:] == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]  # four rounds, rotating the first function
    assert all(len(t.samples_us) == 4 and not t.graph and t.min_us > 0 for t in timings)
    assert all(torch.equal(out, x) for out, x in zip(outs, sources))


def test_measured_ceilings_are_plausible() -> None:
    import torch

    from deepgemm.bench.ceilings import measure_ceilings

    ceilings = measure_ceilings(torch.cuda.get_device_name(), get_gpu("h200"))
    assert 1000 < ceilings.bandwidth_gbs < 10000
    assert 200 < ceilings.bf16_tflops < 1200
    assert ceilings.fp8_tflops is not None and ceilings.fp8_tflops > ceilings.bf16_tflops


def test_bench_and_report_commands_end_to_end(tmp_path: Path) -> None:
    from deepgemm.commands import bench, report

    parser = argparse.ArgumentParser(prog="deepgemm")
    sub = parser.add_subparsers(dest="command", required=True)
    bench.register(sub)
    report.register(sub)
    out = tmp_path / "smoke.json"
    args = parser.parse_args(["bench", "--suite", "smoke", "--datasheet", "--json", str(out), "--markdown",
                              str(tmp_path / "smoke.md")])
    assert args.func(args) == 0
    args = parser.parse_args(["bench", "--compare", str(out), "--suite", "smoke", "--datasheet", "--fail-below", "0.5"])
    assert args.func(args) == 0
    args = parser.parse_args(["report", str(out), "--plot", str(tmp_path / "roofline.png")])
    assert args.func(args) == 0
    assert (tmp_path / "roofline.png").stat().st_size > 0 and (tmp_path / "roofline-speedup.png").exists()


def test_moe_cases_run_accurately_and_keep_their_labels(tmp_path: Path) -> None:
    """The MoE suite's runner on two small cases (odd counts, a padded contiguous segment, an empty masked group):
    deepgemm's grouped GEMM runs from a CUDA graph and matches float64 on the valid rows; DeepGEMM, where installed,
    too; the case label survives the results file."""
    from deepgemm.bench.moe_cases import MoeCase
    from deepgemm.bench.runner import run_moe_bench

    cases = [MoeCase("contiguous", 3, 200, (130, 1, 257), 384, 512),
             MoeCase("masked", 3, 40, (5, 64, 0), 256, 768, max_m=64)]
    results = run_moe_bench(cases, BenchSettings(iters=5, warmup=1, suite="test"), datasheet(), progress=quiet)
    for case in cases:
        ours = results.find(case.shape, "deepgemm")
        assert ours is not None and ours.ok and ours.accurate, f"{case.label}: {ours and (ours.reason, ours.calc_diff)}"
        assert ours.case == case.label and ours.cuda_graph and ours.bytes == case.hbm_bytes()
        peer = results.find(case.shape, "deepseek-deepgemm")
        if peer is not None:
            assert peer.status in ("ok", "n/a"), f"{case.label} DeepGEMM: {peer.reason}"
            assert not peer.ok or peer.accurate, f"{case.label} DeepGEMM: calc_diff {peer.calc_diff}"
    path = tmp_path / "moe.json"
    results.save(path)
    assert BenchResults.load(path).measurements == results.measurements
