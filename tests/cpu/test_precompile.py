"""Precompiling a model's kernels (no GPU): the planner builds the runtime's specs and dedupes them, the compile
counter, `deepgemm.nn.precompile_model` and `deepgemm precompile`. Six 1D2D compiles in all; the rest plans only."""

from __future__ import annotations

import collections
import json
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from deepgemm.analysis.presets import resolve_model
from deepgemm.api import gemm as gemm_api
from deepgemm.api.precompile import (
    DEFAULT_TOKENS,
    KernelDone,
    Target,
    contiguous_kernel,
    contiguous_m_total,
    dense_kernel,
    masked_kernel,
    masked_rows,
    quantizer_kernel,
    token_counts,
    unique_sources,
)
from deepgemm.api.tuned import TunedLookups
from deepgemm.cli import main
from deepgemm.commands.precompile import plan_model, planning_target
from deepgemm.jit import compiler
from deepgemm.jit.compiler import (
    CompileStats,
    KernelSource,
    compile_kernel,
    compile_stats,
)
from deepgemm.kernels.sm90_fp8_gemm_1d2d import plan as plan_module
from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import (
    Geometry,
    get_grouped_plan,
    get_plan,
)
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind, GemmProblem
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec
from deepgemm.nn.linear import Fp8Linear
from deepgemm.nn.precompile import fp8_layer_shapes, precompile_model

pytestmark = pytest.mark.usefixtures("small_fp8_route")  # small layers take the FP8 path

H200 = Target(num_sms=132, gpu_name="NVIDIA H200")
TINY_KERNEL = KernelSource(code='extern "C" __global__ void deepgemm_kernel(int* out) { *out = 1; }',
                           label="test precompile counter")


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def fake_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's planners on device 0 = an H200, with plan building stopped at the spec (no kernel load)."""
    monkeypatch.setattr(gemm_api, "sm_count", lambda index: 132)
    monkeypatch.setattr(gemm_api, "device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(gemm_api, "_tuned", TunedLookups())
    monkeypatch.setattr(plan_module, "sm_count", lambda index: 132)
    monkeypatch.setattr(plan_module, "_build", lambda table, key, index, geometry, spec, what: spec)
    monkeypatch.delenv("DEEPGEMM_AUTOTUNE", raising=False)


# ---------------------------------------------------------------- the planner builds the runtime's specs


@pytest.mark.parametrize(("m", "n", "k", "out_dtype"), [
    (1, 2112, 7168, torch.bfloat16), (129, 4608, 7168, torch.bfloat16), (4096, 2112, 7168, torch.bfloat16),
    (2048, 7168, 16384, torch.bfloat16), (8192, 512, 7168, torch.float32)])
def test_dense_spec_is_the_runtime_one(fake_h200: None, m: int, n: int, k: int, out_dtype: torch.dtype) -> None:
    runtime = get_plan(0, m, n, k, out_dtype, gemm_api.tuned_config(0, m, n, k, out_dtype))  # fp8_gemm_nt's call
    assert dense_kernel(m, n, k, out_dtype, H200) == runtime == gemm_api.planned_spec(m, n, k, out_dtype, 132,
                                                                                       "NVIDIA H200")


def test_dense_spec_reads_the_gpus_tuned_table() -> None:
    tuned, untuned = (dense_kernel(4096, 2112, 7168, torch.bfloat16, target) for target in (H200, Target(132)))
    assert tuned != untuned and tuned.config.stream_tail  # the shipped H200 entry for this bucket


@pytest.mark.parametrize(("tokens", "experts", "topk", "n", "k"), [
    (1, 256, 8, 512, 7168), (64, 256, 8, 7168, 256), (4096, 256, 8, 512, 7168), (8192, 8, 2, 4096, 14336)])
def test_grouped_specs_are_the_runtime_ones(fake_h200: None, tokens: int, experts: int, topk: int, n: int,
                                            k: int) -> None:
    m_total = contiguous_m_total(tokens, topk, experts)
    runtime = get_grouped_plan(0, GemmKind.GROUPED_CONTIGUOUS, Geometry(rows=m_total, groups=experts), n, k,
                               torch.bfloat16, m_total)  # m_grouped_fp8_gemm_nt_contiguous's call
    assert contiguous_kernel(m_total, experts, n, k, torch.bfloat16, H200) == runtime
    expected_m, max_m = masked_rows(tokens, topk, experts)
    geometry = Geometry(rows=experts * max_m, groups=experts, max_m=max_m, tiles_known=False)
    runtime = get_grouped_plan(0, GemmKind.GROUPED_MASKED, geometry, n, k, torch.bfloat16, expected_m)
    assert masked_kernel(expected_m, max_m, experts, n, k, torch.bfloat16, H200) == runtime


def test_grouped_spec_defaults_to_the_heuristic() -> None:
    problem = GemmProblem(1024, 512, 7168, 132, torch.bfloat16, GemmKind.GROUPED_CONTIGUOUS, 256)
    spec = contiguous_kernel(1024, 256, 512, 7168, torch.bfloat16, H200)
    assert spec == Fp8GemmSpec(512, 7168, torch.bfloat16, choose_config(problem), GemmKind.GROUPED_CONTIGUOUS)


def test_moe_rows_follow_the_layouts() -> None:
    assert contiguous_m_total(1, 8, 256) == 8 * 128  # 8 experts of one row, each padded to 128
    assert contiguous_m_total(8192, 8, 256) == 65536  # 256 rows per expert: already aligned
    assert contiguous_m_total(1000, 2, 8) == 8 * 256  # 250 rows per expert
    assert contiguous_m_total(3, 3, 4) == 3 * 128 + 128  # 9 rows over 4 experts: 3, 2, 2, 2
    assert masked_rows(1, 8, 256) == (1, 64)
    assert masked_rows(256, 8, 256) == (9, 256)


def test_token_counts_are_checked() -> None:
    assert token_counts([4, 1, 4]) == (1, 4)
    for bad in ([], [0], [2, -1], [True]):
        with pytest.raises(ValueError):
            token_counts(bad)
    with pytest.raises(TypeError):
        quantizer_kernel(torch.int8)
    with pytest.raises(ValueError):
        Target(0)


# ---------------------------------------------------------------- dedupe and a model's plan


def test_unique_sources_dedupes_in_order() -> None:
    a = dense_kernel(1, 2112, 7168, torch.bfloat16, H200)
    b = dense_kernel(2, 2112, 7168, torch.bfloat16, H200)  # the same tile choice as M = 1
    c = dense_kernel(4096, 2112, 7168, torch.bfloat16, H200)
    quantizer = quantizer_kernel(torch.bfloat16)
    sources = unique_sources([a, b, quantizer, c, quantizer, a])
    assert a == b and len(sources) == 3
    assert [s.label for s in sources] == [a.label(), quantizer.label, c.label()]


def test_deepseek_v3_tp8_plan(capsys: pytest.CaptureFixture[str]) -> None:
    sources = plan_model(resolve_model("deepseek-v3"), 8, DEFAULT_TOKENS, torch.bfloat16, H200)
    kinds = collections.Counter(source.label.split()[0] for source in sources)
    with capsys.disabled():
        print(f"\ndeepseek-v3 --tp 8, tokens 1..8192: {len(sources)} distinct kernels {dict(kinds)}")
    assert 30 <= len(sources) <= 80
    assert len({source.code for source in sources}) == len(sources)
    assert kinds["quantize_per_token_group"] == 1
    assert kinds["m_grouped_fp8_gemm_nt_contiguous"] >= 2 and kinds["m_grouped_fp8_gemm_nt_masked"] >= 2
    labels = " ".join(source.label for source in sources)
    assert "n=16160" not in labels and "n=256 k=7168" not in labels  # the bf16 LM head and router are skipped
    assert all("sms132" in source.label for source in sources if "gemm" in source.label)


# ---------------------------------------------------------------- the compile counter


def test_counter_counts_a_compile_then_a_disk_hit_then_a_memo_hit(fresh_cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    before = compile_stats()
    compile_kernel(TINY_KERNEL)
    assert compile_stats() - before == CompileStats(compiled=1)
    monkeypatch.setattr(compiler, "_memo", {})  # as in a fresh process
    compile_kernel(TINY_KERNEL)
    assert compile_stats() - before == CompileStats(compiled=1, disk_hits=1)
    compile_kernel(TINY_KERNEL)
    assert compile_stats() - before == CompileStats(compiled=1, disk_hits=1, memo_hits=1)


def test_event_count_is_thread_safe() -> None:
    count = compiler._EventCount()
    threads = [threading.Thread(target=lambda: [count.tick() for _ in range(20000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    reads = [count.value() for _ in range(100)]
    for thread in threads:
        thread.join()
    assert reads == sorted(reads) and count.value() == 80000 and count.value() == 80000


# ---------------------------------------------------------------- precompile_model


def test_precompile_model_compiles_once(fresh_cache: Path) -> None:
    model = nn.Sequential(Fp8Linear(512, 512), nn.ReLU(), Fp8Linear(512, 512), Fp8Linear(64, 64))
    assert fp8_layer_shapes(model) == [(512, 512, torch.bfloat16)]  # the 64 x 64 layer runs a bf16 matmul
    events: list[KernelDone] = []
    first = precompile_model(model, (1, 4096), workers=2, progress=events.append)
    assert (first.kernels, first.compiled, first.cached, first.cache_dir) == (3, 3, 0, fresh_cache)
    assert [event.done for event in events] == [1, 2, 3] and {event.total for event in events} == {3}
    assert "3 kernels: 3 compiled, 0 already cached" in str(first)
    second = precompile_model(model, (4096, 1))
    assert (second.kernels, second.compiled, second.cached) == (3, 0, 3)


# ---------------------------------------------------------------- deepgemm precompile


def _tiny_config(path: Path) -> Path:
    """A one-layer Llama whose four projections have two shapes: [1024, 512] (QKV, gate/up), [512, 512]."""
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 512,
                                "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 128, "vocab_size": 1000}))
    return path


def test_cli_precompiles_a_config(fresh_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _tiny_config(tmp_path / "config.json")
    assert main(["precompile", "--model", str(config), "--tokens", "1", "--gpu", "h200", "--workers", "2"]) == 0
    out, err = capsys.readouterr()
    assert "3 kernels: 3 compiled, 0 already cached" in out and str(fresh_cache) in out
    assert "[3/3]" in err and "n=1024 k=512" in err and "n=512 k=512" in err and "quantize_per_token_group" in err
    assert main(["precompile", "--model", str(config), "--tokens", "1"]) == 0
    assert "3 kernels: 0 compiled, 3 already cached" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "no-such-model"], "argument --model: unknown model 'no-such-model'"),
    (["--model", "llama-3-8b", "--tp", "3"], "argument --tp"),
    (["--model", "llama-3-8b", "--gpu", "a100"], "not a Hopper GPU"),
    (["--model", "llama-3-8b", "--gpu", "v100"], "argument --gpu: unknown GPU"),
])
def test_cli_bad_input_exits_2(fresh_cache: Path, argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["precompile", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not fresh_cache.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokens", "1,x"], "--tokens"), (["--tokens", "0"], "--tokens"), (["--tokens", ""], "--tokens"),
    (["--num-sms", "0"], "--num-sms"), (["--workers", "-2"], "--workers"),
])
def test_cli_malformed_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["precompile", "--model", "llama-3-8b", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DEEPGEMM_NUM_SMS", raising=False)
    assert planning_target(None, None) == H200  # no GPU here: an H200
    assert planning_target("h20", None) == Target(78, "NVIDIA H20")
    assert planning_target("H100", 120) == Target(120, "NVIDIA H100 80GB HBM3")


# ---------------------------------------------------------------- one target for every no-GPU planner


def test_commands_without_a_gpu_plan_for_the_same_h200(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`deepgemm compile` and the bench plan used the cost model alone without a GPU, where `deepgemm precompile`
    read the H200's tuned table (4096 x 2112 x 7168 runs a stream tail there: `sk2`)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DEEPGEMM_NUM_SMS", raising=False)
    plain = gemm_api.precompile_fp8_gemm_nt(4096, 2112, 7168)  # the library without a GPU: the cost model
    tuned = gemm_api.precompile_fp8_gemm_nt(4096, 2112, 7168, gpu="NVIDIA H200")
    assert not plain.label.endswith("sk2") and tuned.label.endswith("sk2")
    assert main(["compile", "--shape", "4096,2112,7168"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("planning for NVIDIA H200 (132 SMs)") and f"K=7168: {tuned.label}" in out
    assert main(["bench", "--shape", "4096,2112,7168", "--results-dir", str(fresh_cache.parent / "plan")]) == 0
    plan = json.loads((fresh_cache.parent / "plan" / "results.json").read_text())
    assert plan["shapes"][0]["config"]["stream_tail"] is True
    with pytest.raises(TypeError, match="'gpu' must be a device name"):
        gemm_api.precompile_fp8_gemm_nt(64, 64, 128, gpu=200)  # type: ignore[arg-type]


def test_bench_plan_checks_refused_shapes_without_compiling(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--no-compile listed a shape the kernel refuses (K % 16 != 0) as fine and exited 0; an FP8 plan for a GPU
    without an FP8 peak printed its banner before exiting 2."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder = str(fresh_cache.parent / "plan")
    assert main(["bench", "--shape", "64,2112,7100", "--no-compile", "--results-dir", folder]) == 1
    assert "'k' is K=7100; it must be a multiple of 16" in capsys.readouterr().out
    assert main(["bench", "--shape", "64,2112,7168", "--no-compile", "--results-dir", folder]) == 0
    capsys.readouterr()
    assert main(["bench", "--suite", "smoke", "--gpu", "a100", "--results-dir", folder]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "no FP8 peak" in captured.err


def test_precompile_model_checks_num_sms_and_gpu() -> None:
    model = nn.Sequential(Fp8Linear(4096, 4096))
    with pytest.raises(ValueError, match="precompile_model: 'num_sms' must be from 1 to"):
        precompile_model(model, (1,), num_sms=10_000)
    with pytest.raises(TypeError, match="precompile_model: 'gpu' must be a device name"):
        precompile_model(model, (1,), gpu=132)  # type: ignore[arg-type]
