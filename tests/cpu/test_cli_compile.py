"""`python -m deepgemm compile` as a user runs it: a subprocess with its own cache directory."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cache: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["DEEPGEMM_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("DEEPGEMM_CLUSTER_M", None)
    return subprocess.run([sys.executable, "-m", "deepgemm", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_compile_prints_config_and_ptxas_report(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_cli("compile", "--shape", "64,2112,7168", cache=cache)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "shape M=64 N=2112 K=7168" in out
    assert "config:" in out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "config:" in line)
    block = [lines[start], *itertools.takewhile(lambda line: line.startswith(" " * 10), lines[start + 1:])]
    assert max(len(line) for line in block) <= 100  # the config is wrapped to fit a 100-column terminal
    config_line = " ".join(line.strip() for line in block)
    for field in ("block_m=", "block_n=", "num_stages=", "num_sms=132", "cluster_m=", "pipelined=", "smem_bytes="):
        assert field in config_line, field
    assert "ptxas:" in out
    ptxas_line = next(line for line in out.splitlines() if "ptxas:" in line)
    assert "0 spill stores" in ptxas_line and "0 spill loads" in ptxas_line, ptxas_line
    assert "0 bytes stack frame" in ptxas_line, ptxas_line
    assert re.search(r"\b\d+ registers", ptxas_line)
    # The cubin went into the requested cache, not the user's.
    cubin = re.search(r"-> (\S+)", out)
    assert cubin is not None
    path = Path(cubin.group(1))
    assert path.is_file() and cache in path.parents


def test_compile_several_shapes_and_fp32(tmp_path: Path) -> None:
    proc = run_cli("compile", "--shape", "1,8,128", "--shape", "129x136x144", "--out-dtype", "fp32",
                   "--num-sms", "78", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("config:") == 2
    assert proc.stdout.count("ptxas:") == 2
    assert "out=fp32" in proc.stdout and "sms78" in proc.stdout
    assert "N=136 K=144" in proc.stdout


@pytest.mark.parametrize("shape", ["64,2112", "a,b,c", "0,2112,7168"])
def test_malformed_shape_exits_2(tmp_path: Path, shape: str) -> None:
    proc = run_cli("compile", "--shape", shape, cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert "--shape" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache" / "kernels").exists()


@pytest.mark.parametrize("shape", ["64,2112,7168,1", "64,-1,7168", "", "64,,7168", "1.5,2112,7168"])
def test_malformed_shape_in_process(shape: str, capsys: pytest.CaptureFixture[str]) -> None:
    from deepgemm.cli import main

    with pytest.raises(SystemExit) as info:
        main(["compile", "--shape", shape])
    assert info.value.code == 2
    assert "--shape" in capsys.readouterr().err


def test_k_not_multiple_of_16_exits_2(tmp_path: Path) -> None:
    proc = run_cli("compile", "--shape", "64,2112,7000", cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert "K=7000" in proc.stderr and "16" in proc.stderr
    assert "Traceback" not in proc.stderr
