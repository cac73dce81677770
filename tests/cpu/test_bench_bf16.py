"""`deepgemm bench --dtype bf16 [--layout nt|nn|tn|tt]` on CPU: the BF16 implementations (ours, DeepGEMM through a
stand-in ``deep_gemm``, cuBLAS as torch.matmul) on the same stored operands, timed interleaved; the GPU path of the
command with fake timing; the offline path compiling the BF16 kernels; the argument rules."""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from deepgemm.analysis.roofline import Ceilings
from deepgemm.api.bf16 import precompile_bf16_gemm
from deepgemm.bench import deepseek, inputs, runner
from deepgemm.bench.compare import compare
from deepgemm.bench.peers import (
    ALL_IMPLEMENTATIONS,
    BF16_LAYOUTS,
    IMPLEMENTATIONS,
    Unavailable,
    bf16_bytes,
    bf16_implementations,
    implementations_for,
)
from deepgemm.bench.results import BenchResults, Measurement
from deepgemm.commands import bench
from deepgemm.tuning.timing import Timing
from deepgemm.utils import calc_diff

LOGICAL = {"nt": "a @ b.t()", "nn": "a @ b", "tn": "a.t() @ b", "tt": "a.t() @ b.t()"}


@pytest.fixture(autouse=True)
def fresh_import() -> Iterator[None]:
    deepseek.load.cache_clear()
    yield
    deepseek.load.cache_clear()


def stand_in(monkeypatch: pytest.MonkeyPatch, layouts: tuple[str, ...] = BF16_LAYOUTS) -> list[tuple]:
    """Install a ``deep_gemm`` whose bf16_gemm_<layout>(a, b, d) writes the float64 product into d (the layouts'
    meaning: A [M, K] or [K, M], B [N, K] or [K, N]) and records the operands it was given."""
    calls: list[tuple] = []
    module = types.ModuleType("deep_gemm")
    module.__version__ = "0.0-test"  # type: ignore[attr-defined]
    for layout in layouts:
        def gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, layout: str = layout) -> None:
            calls.append((layout, a, b))
            x = a.double() if layout[0] == "n" else a.double().t()
            w = b.double() if layout[1] == "t" else b.double().t()
            d.copy_(x @ w.t())
        setattr(module, f"bf16_gemm_{layout}", gemm)
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    return calls


@pytest.mark.parametrize("layout", BF16_LAYOUTS)
def test_every_implementation_computes_the_product_from_the_same_stored_operands(
        layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stand_in(monkeypatch)
    m, n, k = 40, 64, 96
    problem = inputs.make_problem((m, n, k), "bf16", device="cpu", seed=11)
    a, b = problem.bf16_operands(layout)
    assert a.shape == ((m, k) if layout[0] == "n" else (k, m)) and a.is_contiguous()
    assert b.shape == ((n, k) if layout[1] == "t" else (k, n)) and b.is_contiguous()
    assert problem.bf16_operands(layout)[0] is a  # laid out once per problem
    impls = bf16_implementations(layout)
    assert [impl.name for impl in impls] == ["deepgemm-bf16", "deepseek-deepgemm-bf16", "cublas-bf16"]
    assert {impl.operation for impl in impls} == {"bf16"}  # one operation: timed interleaved
    assert impls[0].description == f"deepgemm.bf16_gemm_{layout}"
    assert f"deep_gemm.bf16_gemm_{layout}" in impls[1].description and LOGICAL[layout] in impls[2].description
    for impl in impls:
        prepared = impl.prepare(problem)
        out = prepared.fn()
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        assert calc_diff(out, prepared.reference()) < 1e-5, impl.name
        assert prepared.bytes == bf16_bytes(m, n, k)
    assert len(calls) == 1 and calls[0][0] == layout and calls[0][1] is a and calls[0][2] is b
    assert impls[1].prepare(problem).note == "deep_gemm 0.0-test"


def test_deepgemm_bf16_writes_a_preallocated_output_each_call() -> None:
    problem = inputs.make_problem((16, 32, 64), "bf16", device="cpu", seed=1)
    prepared = bf16_implementations("nn")[0].prepare(problem)
    first = prepared.fn()
    assert prepared.fn() is first  # the out= form, as the FP8 row times it


def test_a_peer_without_the_layout_or_not_installed_is_unavailable_or_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch, layouts=("nt",))
    problem = inputs.make_problem((16, 32, 64), "bf16", device="cpu", seed=2)
    with pytest.raises(Unavailable, match="has no bf16_gemm_tn"):
        bf16_implementations("tn")[1].prepare(problem)
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # type: ignore[arg-type]
    deepseek.load.cache_clear()
    kept, left_out = runner.runnable(bf16_implementations("tt"))
    assert [impl.name for impl in kept] == ["deepgemm-bf16", "cublas-bf16"]
    assert "not importable" in left_out["deepseek-deepgemm-bf16"]


def test_which_implementations_a_run_times() -> None:
    assert [i.description for i in implementations_for("bf16")] == [i.description for i in IMPLEMENTATIONS["bf16"]]
    assert implementations_for("fp8") == IMPLEMENTATIONS["fp8"]
    with pytest.raises(ValueError, match="--layout"):
        implementations_for("fp8", "tn")
    with pytest.raises(ValueError, match="--layout"):
        bf16_implementations("tx")
    assert {"deepseek-deepgemm-bf16", "cublas-bf16"} <= set(ALL_IMPLEMENTATIONS)  # --skip accepts them


# ---------------------------------------------------------------- the command's GPU path, timing faked


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="deepgemm")
    sub = parser.add_subparsers(dest="command", required=True)
    bench.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The GPU path of `deepgemm bench` on CPU tensors: problems built on the CPU, timing faked (each sample list
    from bench_gpu_interleaved records the functions it was given, in order). Returns those calls."""
    calls: list[list[str]] = []
    original = inputs.make_problem

    def fake_interleaved(fns: list, **_: Any) -> list[Timing]:
        calls.append([getattr(fn, "__qualname__", "?") for fn in fns])
        return [Timing.from_samples([10.0 * (i + 1)] * 3) for i in range(len(fns))]

    monkeypatch.setattr(bench, "cuda_device_problem", lambda: None)
    monkeypatch.setattr(runner, "make_problem", lambda shape, precision, *, device, seed=0:
                        original(shape, precision, device="cpu", seed=seed))
    monkeypatch.setattr(runner, "bench_gpu_interleaved", fake_interleaved)
    monkeypatch.setattr(runner, "environment", lambda: {"device": "NVIDIA H200 (fake)", "num_sms": 132})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    return calls


@pytest.mark.parametrize("layout", BF16_LAYOUTS)
def test_bench_bf16_times_ours_deepgemm_and_cublas_interleaved(layout: str, fake_gpu: list[list[str]],
                                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    stand_in(monkeypatch)
    code = run_cli("bench", "--dtype", "bf16", "--layout", layout, "--shape", "64,256,512", "--shape", "136,128,72",
                   "--datasheet", "--iters", "3", "--warmup", "0", "--results-dir", str(tmp_path))
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"dtype bf16 ({layout})" in out
    assert [len(call) for call in fake_gpu] == [3, 3]  # per shape: the three timed together
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["settings"]["dtype"] == "bf16" and document["settings"]["layout"] == layout
    assert document["implementations"]["deepgemm-bf16"] == f"deepgemm.bf16_gemm_{layout}"
    assert LOGICAL[layout] in document["implementations"]["cublas-bf16"]
    rows = document["results"]
    assert [(r["m"], r["impl"]) for r in rows] == [(64, "deepgemm-bf16"), (64, "deepseek-deepgemm-bf16"),
                                                  (64, "cublas-bf16"), (136, "deepgemm-bf16"),
                                                  (136, "deepseek-deepgemm-bf16"), (136, "cublas-bf16")]
    for r in rows:
        assert r["status"] == "ok" and r["precision"] == "bf16" and r["calc_diff"] < 1e-5, r
        assert r["bytes"] == bf16_bytes(r["m"], r["n"], r["k"])
    ours = rows[0]
    assert ours["speedup"] == {"deepseek-deepgemm-bf16": 2.0, "cublas-bf16": 3.0}
    assert f"(layout {layout})" in (tmp_path / "results.md").read_text()


def test_bench_bf16_skips_a_peer_and_notes_a_missing_deepgemm(fake_gpu: list[list[str]], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # type: ignore[arg-type]
    assert run_cli("bench", "--dtype", "bf16", "--shape", "64,256,512", "--datasheet", "--iters", "3",
                   "--skip", "cublas-bf16", "--results-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "left out: deepseek-deepgemm-bf16" in out and "left out: cublas-bf16: skipped on request" in out
    document = json.loads((tmp_path / "results.json").read_text())
    assert [r["impl"] for r in document["results"]] == ["deepgemm-bf16"]
    assert document["settings"]["layout"] == "nt"


# ---------------------------------------------------------------- without a GPU, and argument rules


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "cuda_device_problem", lambda: "no CUDA GPU (test)")


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_offline_bench_bf16_compiles_the_layouts_kernels(layout: str, no_gpu: None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("bench", "--dtype", "bf16", "--layout", layout, "--shape", "4096,7168,2048",
                   "--results-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert f"bf16 ({layout}) kernels and roofline predictions" in out
    config = precompile_bf16_gemm(layout, 4096, 7168, 2048, num_sms=132).config
    assert f"{config.block_m}x{config.block_n}x64" in out and "0/0" in out and "rror" not in out
    assert "does not exist yet" not in out


def test_precompile_bf16_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="'layout'"):
        precompile_bf16_gemm("xy", 1, 8, 8)
    with pytest.raises(ValueError, match="'m'"):
        precompile_bf16_gemm("nt", 0, 8, 8)
    with pytest.raises(ValueError, match="N=12"):
        precompile_bf16_gemm("nt", 1, 12, 8)
    with pytest.raises(TypeError, match="'out_dtype'"):
        precompile_bf16_gemm("nt", 1, 8, 8, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="'num_sms'"):
        precompile_bf16_gemm("nt", 1, 8, 8, num_sms=0)


@pytest.mark.parametrize("argv,message", [
    (("bench", "--layout", "tn", "--no-compile"), "argument --layout: tn needs --dtype bf16"),
    (("bench", "--model", "llama-3-8b", "--layout", "nn"), "not with --layout nn"),
])
def test_layout_rules_exit_2(argv: tuple[str, ...], message: str, no_gpu: None,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(*argv) == 2
    assert message in capsys.readouterr().err


def test_bad_layout_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli("bench", "--dtype", "bf16", "--layout", "tx")
    assert exit_info.value.code == 2 and "--layout" in capsys.readouterr().err


def test_compare_notes_a_baseline_of_another_layout() -> None:
    def results(layout: str) -> BenchResults:
        m = Measurement(64, 256, 512, "deepgemm-bf16", "bf16", "ok", median_us=10.0, calc_diff=0.0, bytes=1)
        return BenchResults(Ceilings(900.0, None, 4000.0, "test"), [m], settings={"dtype": "bf16", "layout": layout})

    assert compare(results("nt"), results("nt")).notes == ()
    notes = compare(results("nt"), results("tn")).notes
    assert any("--layout nt" in note and "--layout tn" in note for note in notes)
