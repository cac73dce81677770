"""CLI smoke tests of shapes, bench (no GPU) and report: exit codes, messages, files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from deepgemm.commands import bench, report, shapes

DATA = Path(__file__).resolve().parents[2] / "benchmarks"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="deepgemm")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (shapes, bench, report):
        command.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_shapes_prefill_and_decode(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("shapes", "--model", "llama-3-8b", "--seq", "4096", "--decode-tokens", "1", "--batch", "64") == 0
    out = capsys.readouterr().out
    assert "prefill: M = 262144 tokens" in out and "decode step: M = 64 tokens" in out
    assert "mlp.gate_up_proj" in out and "roofline time by phase" in out


def test_shapes_train_moe_mla_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ds.json"
    assert run("shapes", "--model", "deepseek-v3", "--seq", "1024", "--train", "--tp", "8", "--gpu", "h100",
               "--json", str(path)) == 0
    out = capsys.readouterr().out
    assert "[dgrad]" in out and "[wgrad]" in out and "MoE routing balanced" in out
    document = json.loads(path.read_text())
    assert document["format"] == "deepgemm-shapes" and document["gpu"] == "h100-sxm"
    gemms = document["phases"][0]["gemms"]
    q_b = next(g for g in gemms if g["name"] == "attn.q_b_proj" and g["pass"] == "forward")
    assert q_b["flops"] == 2 * 1024 * (16 * 192) * 1536 * 61  # 128 heads / 8 ranks


def test_shapes_reads_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096,
                                  "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000}))
    assert run("shapes", "--model", str(config), "--seq", "16") == 0
    assert "attn.qkv_proj" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("shapes", "--model", "no-such-model"), "argument --model: unknown model 'no-such-model'"),
        (("shapes", "--model", "llama-3-8b", "--tp", "3"), "argument --tp"),
        (("shapes", "--model", "llama-3-8b", "--batch", "0"), "argument --batch"),
        (("shapes", "--model", "llama-3-8b", "--gpu", "a100"), "no FP8"),
        (("bench", "--suite", "nope"), "argument --suite: unknown suite 'nope'"),
        (("report", "missing.json"), "argument results"),
    ],
)
def test_bad_input_exits_2_with_a_named_argument(argv: tuple[str, ...], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run(*argv) == 2
    assert message in capsys.readouterr().err


def test_malformed_config_and_shape_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{\"hidden_size\": 12,")
    assert run("shapes", "--model", str(bad)) == 2
    assert "not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run("bench", "--shape", "64,abc,7168")
    assert exit_info.value.code == 2
    assert "argument --shape" in capsys.readouterr().err


def test_bench_without_gpu_compiles_and_predicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("bench", "--suite", "smoke") == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU" in out and "roofline predictions" in out
    assert "64x2112x7168" in out and "4096x4096x7168" in out
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config

    picked = choose_fp8_gemm_config(4096, 4096, 7168, 132)
    assert f"{picked.block_m}x{picked.block_n}x128" in out, "the compiled tile of 4096x4096x7168 is not shown"
    assert "0/0" in out and "rror" not in out


def test_bench_without_gpu_and_without_compiling(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("bench", "--shape", "1,2112,7168", "--no-compile", "--gpu", "h100", "--dtype", "bf16") == 0
    out = capsys.readouterr().out
    assert "compilation skipped" in out and "H100" in out and "memory" in out


def test_report_and_compare_on_stored_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from .test_bench_results import crafted

    baseline, current = tmp_path / "base.json", tmp_path / "now.json"
    crafted().save(baseline)
    crafted(1.0, **{"128_24576_1536": 1.5}).save(current)
    assert run("report", str(baseline), "--plot", str(tmp_path / "plots" / "roofline.png"),
               "--markdown", str(tmp_path / "summary.md")) == 0
    assert (tmp_path / "plots" / "roofline.png").exists() and (tmp_path / "plots" / "roofline-speedup.png").exists()
    assert "![plots/roofline.png](plots/roofline.png)" in (tmp_path / "summary.md").read_text()
    capsys.readouterr()
    assert run("bench", "--compare", str(baseline), "--results", str(baseline)) == 0
    assert "PASS" in capsys.readouterr().out
    assert run("bench", "--compare", str(baseline), "--results", str(current), "--fail-below", "0.9") == 1
    assert "FAIL: 1 of 3" in capsys.readouterr().out
    assert run("bench", "--results", str(current)) == 2


def test_bench_compare_without_gpu_says_nothing_was_measured(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from .test_bench_results import crafted

    baseline = tmp_path / "base.json"
    crafted().save(baseline)
    assert run("bench", "--compare", str(baseline), "--no-compile") == 0
    out = capsys.readouterr().out
    assert "nothing to compare" in out and "128x24576x1536" in out  # the baseline's shapes were planned


@pytest.mark.parametrize("name", ["h200-deepseek-v3.json"])
def test_report_from_stored_baseline(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored = DATA / name
    assert run("report", str(stored), "--plot", str(tmp_path / "roofline.png"), "--markdown",
               str(tmp_path / "summary.md")) == 0
    assert (tmp_path / "roofline.png").stat().st_size > 10_000
    assert (tmp_path / "roofline-speedup.png").stat().st_size > 10_000
    summary = (tmp_path / "summary.md").read_text()
    assert "NVIDIA H200" in summary and "| cublas-blockwise |" in summary
    assert run("bench", "--compare", str(stored), "--results", str(stored)) == 0
    assert "PASS" in capsys.readouterr().out


def test_stored_baselines_hold_complete_accurate_suites() -> None:
    from deepgemm.bench.results import BenchResults
    from deepgemm.bench.suites import suite_shapes

    for suite in ("deepseek-v3",):
        results = BenchResults.load(DATA / f"h200-{suite}.json")
        assert results.shapes() == list(suite_shapes(suite))
        assert all(m.ok and m.accurate for m in results.measurements)
