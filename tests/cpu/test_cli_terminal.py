"""The command line as a terminal user meets it (issue 25, points 9-12): tables fit 100 columns, a closed pipe ends
a command quietly, progress says "cached" or "compiled" as it was, --version, --num-sms and --gpu are checked, a
shape deepgemm refuses fails `bench`, and the main job ends with a summary line and the results it wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from deepgemm.bench import console, results_dir
from deepgemm.bench.results import BenchResults
from deepgemm.cli import BROKEN_PIPE_EXIT, main, version
from deepgemm.commands import bench

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "benchmarks" / "h200-deepseek-v3.json"
WIDTH = 100
BORDERS = set("┏┃┡│└━─")


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if set(line) & BORDERS]


def widest_table_line(text: str) -> int:
    lines = table_lines(text)
    assert lines, "no table in the output:\n" + text
    return max(len(line) for line in lines)


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "cuda_device_problem", lambda: "no CUDA GPU (test)")


@pytest.fixture
def results_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "deepgemm-results"
    monkeypatch.setattr(results_dir, "DEFAULT_RESULTS_ROOT", root)
    return root


# ---------------------------------------------------------------- 9. tables fit 100 columns


@pytest.mark.parametrize("plain", [False, True], ids=["rich", "plain"])
@pytest.mark.parametrize("argv", [
    ["shapes", "--model", "deepseek-v3", "--seq", "1024", "--train", "--tp", "8"],
    ["shapes", "--model", "qwen3-30b-a3b", "--decode-tokens", "4", "--seq", "8192", "--batch", "32"],
    ["shapes", "--model", "mixtral-8x7b", "--no-fuse"],
    ["report", str(STORED)],
    ["bench", "--compare", str(STORED), "--results", str(REPO / "benchmarks" / "h200-decode.json")],
    ["bench", "--suite", "deepseek-v3", "--no-compile"],
    ["bench", "--suite", "smoke"],
    ["bench", "--model", "deepseek-v3"],
], ids=["shapes-train", "shapes-decode", "shapes-unfused", "report", "compare", "bench-predict", "bench-compile",
        "bench-model"])
def test_tables_fit_100_columns(argv: list[str], plain: bool, no_gpu: None, results_root: Path,
                                monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if plain:
        monkeypatch.setattr(console, "_rich_console", lambda: None)
    assert main(argv) in (0, 1)
    out = capsys.readouterr().out
    if plain:  # a plain table's rule under its header is as wide as the table
        rules = [line for line in out.splitlines() if line.startswith("-") and set(line) <= {"-", " "}]
        assert rules and max(len(line) for line in rules) <= WIDTH, out
    else:
        assert widest_table_line(out) <= WIDTH, out
    if argv[0] == "bench" and "--model" not in argv and "--compare" not in argv:
        assert "4096x4096x7168" in out or "4096x24576x1536" in out  # the shape column is whole


def test_offline_table_folds_the_other_config(no_gpu: None, results_root: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--suite", "smoke"]) == 0
    out = capsys.readouterr().out
    assert widest_table_line(out) <= WIDTH
    lines = out.splitlines()
    folded = lines[lines.index("other config:") + 1:]
    assert folded[0].startswith("  64x2112x7168: ") and "smem_bytes=" in "".join(folded)
    assert all(len(line) <= WIDTH for line in folded[:6])


def test_print_table_drops_then_splits_and_never_cuts_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    shape = "32768x24576x16384"
    headers = ["shape", *(f"column {i}" for i in range(12)), "notes"]
    rows = [[shape, *(f"{1000 * i:,}" for i in range(12)), "free text " * 20]]
    console.print_table("wide", headers, rows, fold=(13,), drop=(1,))
    out = capsys.readouterr().out
    assert widest_table_line(out) <= WIDTH
    assert "(continued)" in out and out.count(shape) >= 3  # in both parts and the folded line
    assert "left out to fit 100 columns: column 0" in " ".join(out.split()) and "\nnotes:\n" in out


# ---------------------------------------------------------------- 9. a closed pipe


def _run_with_closed_stdout(argv: list[str], tmp_path: Path, *, close_when: Path | None = None,
                            timeout: float = 120) -> tuple[int, str]:
    """Run the CLI with a stdout pipe the reader closes at once, or once `close_when` exists."""
    with open(tmp_path / "stderr.txt", "w+", encoding="utf-8") as err:
        proc = subprocess.Popen([sys.executable, "-m", "deepgemm", *argv], stdout=subprocess.PIPE, stderr=err,
                                cwd=tmp_path, env=cli_env())
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while close_when is not None and not close_when.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the results were never written"
            time.sleep(0.05)
        proc.stdout.close()
        code = proc.wait(timeout=timeout)
        err.seek(0)
        return code, err.read()


@pytest.mark.parametrize(("argv", "codes"), [
    (["shapes", "--model", "deepseek-v3", "--seq", "1024", "--train"], {BROKEN_PIPE_EXIT}),
    (["report", str(STORED)], {BROKEN_PIPE_EXIT}),
    (["bench", "--help"], {0, BROKEN_PIPE_EXIT}),  # argparse itself ignores a failed write of its help
], ids=["shapes", "report", "bench-help"])
def test_a_closed_pipe_ends_quietly(argv: list[str], codes: set[int], tmp_path: Path) -> None:
    code, err = _run_with_closed_stdout(argv, tmp_path)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert code in codes


def test_results_are_written_before_the_table(tmp_path: Path) -> None:
    """Over 64 KiB of table: the command blocks on the pipe after writing its files; the reader then goes away."""
    shapes = [arg for m in range(1, 1201) for arg in ("--shape", f"{m},4096,7168")]
    out_json, out_md = tmp_path / "plan.json", tmp_path / "plan.md"
    code, err = _run_with_closed_stdout(["bench", "--no-compile", *shapes, "--json", str(out_json),
                                         "--markdown", str(out_md)], tmp_path, close_when=out_md)
    assert "Traceback" not in err, err[-2000:]
    assert code == BROKEN_PIPE_EXIT
    document = json.loads(out_json.read_text())
    assert document["format"] == "deepgemm-bench-plan" and len(document["shapes"]) == 1200
    assert "1200x4096x7168" in out_md.read_text()


# ---------------------------------------------------------------- 10. cached or compiled


def test_compile_says_from_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["compile", "--shape", "1,8,128"]) == 0
    first = capsys.readouterr().out
    assert "compiled in" in first and "from cache" not in first
    assert main(["compile", "--shape", "1,8,128"]) == 0
    second = capsys.readouterr().out
    assert "from cache" in second and "compiled in" not in second


def test_precompile_progress_says_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 512,
                                  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "head_dim": 128, "vocab_size": 1000}))
    argv = ["precompile", "--model", str(config), "--tokens", "1", "--gpu", "h200", "--workers", "2"]
    assert main(argv) == 0
    first = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert len(first) == 3 and all(re.match(r"\[\d/3\] compiled +\d+\.\d s ", line) for line in first), first
    assert main(argv) == 0
    second = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert len(second) == 3 and all(re.match(r"\[\d/3\] cached ", line) for line in second), second


def test_offline_bench_progress_says_cached(tmp_path: Path, no_gpu: None, results_root: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["bench", "--shape", "1,8,128"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\[1/1\] kernel 1x8x128: compiled in \d+\.\d+ s", err), err
    assert "cached" not in err and "0 compiled" not in out
    assert main(["bench", "--shape", "1,8,128"]) == 0
    out, err = capsys.readouterr()
    assert "[1/1] kernel 1x8x128: cached" in err and "compil" not in err, err
    assert "cached" in table_lines(out)[3] and "0 compiled, 1 from cache" in out


# ---------------------------------------------------------------- 11. --version, --num-sms, --gpu, shape errors


def test_version(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import deepgemm
    from deepgemm import cli

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"deepgemm {version()}"

    def missing(name: str) -> str:
        raise cli.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", missing)
    assert version() == deepgemm.__version__


@pytest.mark.parametrize("argv", [["compile", "--shape", "64,2112,7168", "--num-sms", "0"],
                                  ["compile", "--shape", "64,2112,7168", "--num-sms", "many"],
                                  ["precompile", "--model", "llama-3-8b", "--num-sms", "-1"]])
def test_num_sms_not_a_positive_int_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "argument --num-sms" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "most"), [
    (["compile", "--shape", "64,2112,7168", "--num-sms", "133"], 132),
    (["precompile", "--model", "llama-3-8b", "--num-sms", "500"], 132),
    (["precompile", "--model", "llama-3-8b", "--gpu", "h20", "--num-sms", "79"], 78),
])
def test_num_sms_above_the_gpus_count_exits_2(argv: list[str], most: int, no_gpu: None, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument --num-sms: must be from 1 to {most}" in err and "Traceback" not in err
    assert not (tmp_path / "cache").exists()  # refused before anything was compiled


def test_gpu_that_cannot_run_sm90a(no_gpu: None, results_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--shape", "64,2112,7168", "--gpu", "b200"]) == 0
    out, err = capsys.readouterr()
    assert "NVIDIA B200 (sm_100) cannot run deepgemm's kernels" in out
    assert "kernel" not in err and "0 compiled" not in out and "no kernels compiled" in out
    assert main(["precompile", "--model", "llama-3-8b", "--gpu", "b200"]) == 2
    assert "not a Hopper GPU (sm_100" in capsys.readouterr().err
    assert main(["shapes", "--model", "llama-3-8b", "--gpu", "a100", "--dtype", "bf16"]) == 0
    assert "NVIDIA A100 SXM4 80GB (sm_80) cannot run deepgemm's kernels" in capsys.readouterr().out


def test_bench_shape_error_exits_nonzero(no_gpu: None, results_root: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--shape", "64,2112,7000"]) == 2  # as compile does
    capsys.readouterr()
    assert main(["bench", "--shape", "64,2112,7000", "--shape", "64,2112,7168"]) == 1
    out = capsys.readouterr().out
    assert "64x2112x7000: ValueError" in out and "K=7000" in out and "1 failed" in out


# ---------------------------------------------------------------- 12. summary line and results files


def _last_lines(out: str) -> tuple[str, str]:
    lines = out.rstrip("\n").splitlines()
    return lines[-2], lines[-1]


def _folder_of(results_line: str) -> Path:
    match = re.fullmatch(r"results in (.+)/: results\.json, results\.md", results_line)
    assert match, results_line
    return Path(match.group(1))


def test_offline_main_job_writes_results(no_gpu: None, results_root: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--suite", "deepseek-v3", "--no-compile"]) == 0
    summary, where = _last_lines(capsys.readouterr().out)
    assert summary.startswith("summary: 18 fp8 shapes for NVIDIA H200 SXM (132 SMs)"), summary
    folder = _folder_of(where)
    assert folder.parent == results_root and folder.name.endswith("-bench-plan-deepseek-v3")
    document = json.loads((folder / "results.json").read_text())
    assert document["format"] == "deepgemm-bench-plan" and len(document["shapes"]) == 18
    assert "| 4096x7168x2048 |" in (folder / "results.md").read_text()


def test_gpu_main_job_writes_results(results_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from .test_bench_results import crafted

    monkeypatch.setattr(bench, "cuda_device_problem", lambda: None)
    monkeypatch.setattr(bench, "_measure", lambda args, shapes, gpu, moe: crafted())
    assert main(["bench", "--suite", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert widest_table_line(out) <= WIDTH
    summary, where = _last_lines(out)
    assert summary == ("summary: 3 shapes on NVIDIA H200: deepgemm 1.26x vs cublas-blockwise, 0.90x vs "
                       "cublas-fp8-tensor, 1.79x vs cublas-bf16 (geometric means); 0 deepgemm rows failed or "
                       "inaccurate"), summary
    folder = _folder_of(where)
    assert folder.parent == results_root and folder.name.endswith("-bench-deepseek-v3")
    assert BenchResults.load(folder / "results.json").to_json() == crafted().to_json()
    assert "# deepgemm benchmark" in (folder / "results.md").read_text()

    # --json / --markdown put a file elsewhere, --results-dir names the folder
    assert main(["bench", "--suite", "deepseek-v3", "--json", str(tmp_path / "a.json"),
                 "--results-dir", str(tmp_path / "mine")]) == 0
    assert _last_lines(capsys.readouterr().out)[1] == f"results: {tmp_path / 'a.json'}, {tmp_path}/mine/results.md"
    assert (tmp_path / "a.json").is_file() and (tmp_path / "mine" / "results.md").is_file()


def test_model_run_writes_results(results_root: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from .test_bench_block import _fake_results

    results, _ = _fake_results("qwen3-30b-a3b", [1, 4096])
    monkeypatch.setattr(bench, "cuda_device_problem", lambda: None)
    monkeypatch.setattr(bench, "run_block_bench", lambda *args, **kwargs: results)
    assert main(["bench", "--model", "qwen3-30b-a3b", "--tokens", "1,4096"]) == 0
    summary, where = _last_lines(capsys.readouterr().out)
    assert summary.startswith("summary: qwen3-30b-a3b, one MoE block: deepgemm 1 tokens 1.10x vs bf16"), summary
    folder = _folder_of(where)
    assert folder.name.endswith("-bench-block-qwen3-30b-a3b")
    assert json.loads((folder / "results.json").read_text())["format"] == "deepgemm-bench-block"
    assert "## 4096 tokens (prefill)" in (folder / "results.md").read_text()


def test_readme_main_job_writes_into_the_working_directory(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "deepgemm", "bench", "--suite", "deepseek-v3", "--no-compile"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    folder = _folder_of(_last_lines(proc.stdout)[1])
    assert not folder.is_absolute() and (tmp_path / folder / "results.json").is_file()
    assert (tmp_path / folder).parent == tmp_path / "deepgemm-results"
